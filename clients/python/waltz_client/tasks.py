"""Owned asyncio tasks and the single thread on which application code runs."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any, TypeVar

log = logging.getLogger(__name__)
R = TypeVar("R")


class TaskSet:
    """Tasks owned by one object: spawned by it, logged if they fail, cancelled when it closes."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, R], name: str) -> asyncio.Task[R]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self, timeout: float) -> None:
        """Wait (at most timeout seconds) for the tasks to end by themselves."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


Done = Callable[[bool, Any], None]
"""Where a scheduled call's outcome goes, on the event loop: (True, result) or (False, exception);
(False, None) when the call never ran because the thread was shut down."""
_Call = tuple[Callable[..., Any], tuple[Any, ...], "Done | asyncio.Future[Any]"]


class CallbackThread:
    """Runs every application callback and context hook, one at a time, on one thread.

    Calls made in the same event-loop iteration, or while the thread is busy, wait together and
    then run as one batch, in the order they were made: a hop between the event loop and a
    thread costs far more than most hooks (two thread wake-ups, and with the GIL up to a switch
    interval when the loop is busy), so many submissions share one hop instead of taking one each.
    The thread is a plain one fed by a queue: an executor's futures cost more than the hooks.
    """

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[tuple[list[_Call], asyncio.AbstractEventLoop] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._waiting: list[_Call] = []
        self._busy = False  # a batch is queued or running, or one is about to start
        self._shut = False
        self._shut_lock = threading.Lock()  # nothing is queued after the thread's stop signal

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.schedule(fn, args, future)
        return await future

    def schedule(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done | asyncio.Future[Any]) -> None:
        """Run fn(*args) on the thread; done (a callable, or a future that is set unless cancelled
        meanwhile) gets the outcome on the event loop, later, never from inside this call."""
        self._waiting.append((fn, args, done))
        if not self._busy:
            self._busy = True  # start on the next iteration: calls made in this one join the batch
            asyncio.get_running_loop().call_soon(self._run_waiting)

    def _run_waiting(self) -> None:
        batch = [call for call in self._waiting if not (isinstance(call[2], asyncio.Future) and call[2].cancelled())]
        self._waiting = []
        if not batch:
            self._busy = False
            return
        with self._shut_lock:
            if not self._shut:
                self._queue.put((batch, asyncio.get_running_loop()))
                return
        self._finish(batch, [(False, RuntimeError("the callback thread is shut down"))] * len(batch))

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            batch, loop = item
            outcomes = [(False, None)] * len(batch) if self._shut else _run_batch(batch)
            try:
                loop.call_soon_threadsafe(self._finish, batch, outcomes)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _finish(self, batch: list[_Call], outcomes: list[tuple[bool, Any]]) -> None:
        for (_, _, done), (ok, value) in zip(batch, outcomes, strict=True):
            if not isinstance(done, asyncio.Future):
                try:
                    done(ok, value)
                except Exception:
                    log.exception("callback-thread completion %r failed", done)
            elif done.done():
                continue
            elif ok:
                done.set_result(value)
            elif value is None:
                done.cancel()
            else:
                done.set_exception(value)
        self._busy = False
        if self._waiting:  # made while this batch ran: they go together, now
            self._busy = True
            self._run_waiting()

    def shutdown(self) -> None:
        """Stop the thread (waiting for a running call unless called from it); what has not run
        yet never will (futures cancelled, done callables get (False, None))."""
        with self._shut_lock:
            self._shut = True
            self._queue.put(None)
        if not self.is_current():
            self._thread.join()


def _run_batch(batch: list[_Call]) -> list[tuple[bool, Any]]:
    """On the callback thread: each call in order; a raising call does not stop the others."""
    outcomes: list[tuple[bool, Any]] = []
    for fn, args, _ in batch:
        try:
            outcomes.append((True, fn(*args)))
        except BaseException as exc:  # handed to the caller, as run_in_executor does
            outcomes.append((False, exc))
    return outcomes
