"""Owned asyncio tasks and the single thread on which application code runs."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
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


class CallbackThread:
    """Runs every application callback and context hook, one at a time, on one thread.

    Calls made while the thread is busy wait together and then run as one batch, in the order
    they were made: a hop between the event loop and a thread costs far more than most hooks
    (and, with the GIL, up to a switch interval when the loop is busy), so many submissions
    share one hop instead of taking one each.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._thread: threading.Thread | None = None
        self._executor.submit(self._remember_thread).result()
        self._waiting: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        self._busy = False

    def _remember_thread(self) -> None:
        self._thread = threading.current_thread()

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((fn, args, future))
        if not self._busy:
            self._run_waiting()
        return await future

    def _run_waiting(self) -> None:
        batch = [call for call in self._waiting if not call[2].cancelled()]
        self._waiting = []
        if not batch:
            self._busy = False
            return
        self._busy = True
        try:
            done = asyncio.get_running_loop().run_in_executor(self._executor, _run_batch, batch)
        except RuntimeError as exc:  # the executor was shut down
            self._busy = False
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        done.add_done_callback(lambda d: self._finish(batch, d))

    def _finish(self, batch: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]],
                done: asyncio.Future[list[tuple[bool, Any]]]) -> None:
        if done.cancelled() or done.exception() is not None:  # shut down before the batch ran
            outcomes = [(False, done.exception() if not done.cancelled() else None)] * len(batch)
        else:
            outcomes = done.result()
        for (_, _, future), (ok, value) in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if ok:
                future.set_result(value)
            elif value is None:
                future.cancel()
            else:
                future.set_exception(value)
        self._run_waiting()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=not self.is_current(), cancel_futures=True)


def _run_batch(batch: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]]) -> list[tuple[bool, Any]]:
    """On the callback thread: each call in order; a raising call does not stop the others."""
    outcomes: list[tuple[bool, Any]] = []
    for fn, args, _ in batch:
        try:
            outcomes.append((True, fn(*args)))
        except BaseException as exc:  # handed to the caller, as run_in_executor does
            outcomes.append((False, exc))
    return outcomes
