"""Owned asyncio tasks and the single thread on which application code runs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque
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


class Job:
    """A call for the callback thread: run() there, then done() with its outcome on the event loop:
    (True, what run returned) or (False, what it raised); (False, None) when it never ran because
    the thread was shut down. A submission is its own job: no objects made per call."""

    __slots__ = ()

    def run(self) -> Any:
        raise NotImplementedError

    def done(self, ok: bool, value: Any) -> None:
        raise NotImplementedError

    @classmethod
    def done_all(cls, jobs: list[Job], values: list[Any]) -> None:
        """done() for each job, in order, with what its run() returned or raised (a _Raised); a class may
        finish a batch of its own jobs (type(job) is cls for all of them) in one pass instead."""
        for job, value in zip(jobs, values, strict=True):
            try:
                if type(value) is _Raised:
                    job.done(False, value.exc)
                else:
                    job.done(True, value)
            except Exception:
                log.exception("callback-thread completion of %r failed", job)


class _Call(Job):
    __slots__ = ("args", "fn", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], future: asyncio.Future[Any]) -> None:
        self.fn, self.args, self.future = fn, args, future

    def run(self) -> Any:
        return self.fn(*self.args)

    def done(self, ok: bool, value: Any) -> None:
        future = self.future
        if future.done():  # cancelled meanwhile
            return
        if ok:
            future.set_result(value)
        elif value is None:
            future.cancel()
        else:
            future.set_exception(value)


class _Post(Job):
    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def run(self) -> Any:
        return self.fn(*self.args)

    def done(self, ok: bool, value: Any) -> None:
        if not ok and value is not None:
            log.error("callback-thread job %s raised", getattr(self.fn, "__name__", self.fn), exc_info=value)


class _Raised:
    """What a job raised, among the values a batch returned (Job.done_all: done(False, exc))."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_NEVER_RAN = _Raised(None)  # type: ignore[arg-type]  # done(False, None)

# The callback threads not shut down yet. At interpreter exit (before non-daemon threads are joined)
# each is told to stop after the jobs already queued, as ThreadPoolExecutor's workers are: a client
# never closed neither hangs the exit nor has a running apply_transaction cut short.
_LIVE: weakref.WeakKeyDictionary[threading.Thread, SimpleQueue[Any]] = weakref.WeakKeyDictionary()


def _stop_at_exit() -> None:
    for queue in list(_LIVE.values()):
        queue.put(None)


threading._register_atexit(_stop_at_exit)  # type: ignore[attr-defined]  # what concurrent.futures uses


class CallbackThread:
    """Runs every application callback and context hook, one at a time, on one thread.

    Jobs scheduled in the same event-loop iteration, or while the thread is busy, wait together and
    then run as one batch, in the order they were scheduled: a hop between the event loop and a
    thread costs far more than most hooks (two thread wake-ups, and with the GIL up to a switch
    interval when the loop is busy), so many submissions share one hop instead of taking one each.
    The thread is a plain one fed by a queue: an executor's futures cost more than the hooks.

    Jobs scheduled `first` (applying the feed: schedule_first, call_first) go ahead of the other waiting
    ones, in their own order: an application's transactions are judged against what it has applied, so a
    crowd of execute() calls must not keep the feed waiting. `busy_seconds` (time spent running jobs) and
    `queue_length()` (jobs waiting or running) show a thread that cannot keep up (client metrics).
    """

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[tuple[list[Job], type[Job], asyncio.AbstractEventLoop] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name)
        self._thread.start()
        _LIVE[self._thread] = self._queue
        self._waiting: list[Job] = []
        self._first = 0  # the jobs scheduled first, at the head of _waiting
        self._kind: type[Job] = Job  # the class of every waiting job, or Job when they are mixed
        self._busy = False  # a batch is queued or running, or one is about to start
        self._running = 0  # jobs in the batch queued or running
        self._urgent: deque[_Post] = deque()  # post_first while a batch runs: run between its jobs (by the thread)
        self.busy_seconds = 0.0  # written by the thread only
        self._shut = False
        self._shut_lock = threading.Lock()  # nothing is queued after the thread's stop signal
        self._loop: asyncio.AbstractEventLoop | None = None  # bind()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop every job is scheduled from (the client's): asyncio.get_running_loop() is a system call
        (getpid) on Linux, and a lone append schedules two batches. Unbound: the running loop, each time."""
        self._loop = loop

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., R], *args: Any) -> asyncio.Future[R]:
        """fn(*args) on the thread: the future of what it returns (a plain future, not a coroutine: one frame fewer
        per apply; cancelling it before its batch starts keeps fn from running)."""
        future: asyncio.Future[R] = (self._loop or asyncio.get_running_loop()).create_future()
        self.schedule(_Call(fn, args, future))
        return future

    def call_first(self, fn: Callable[..., R], *args: Any) -> asyncio.Future[R]:
        """call(), ahead of the jobs that were not scheduled first (schedule_first)."""
        future: asyncio.Future[R] = (self._loop or asyncio.get_running_loop()).create_future()
        self.schedule_first(_Call(fn, args, future))
        return future

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the thread, in order with the other jobs, without waiting for it (it must not
        raise: what it raises is logged)."""
        self.schedule(_Post(fn, args))

    def post_first(self, fn: Callable[..., Any], *args: Any) -> None:
        """post(), ahead of the jobs that were not scheduled first (schedule_first); while a batch runs, between two
        of its jobs (a lock failure's hook waits for the job running, not for the rest of its batch)."""
        if self._running and not self._shut:
            self._urgent.append(_Post(fn, args))  # (the thread pops them; a deque's append and popleft are atomic)
        else:
            self.schedule_first(_Post(fn, args))

    def queue_length(self) -> int:
        """Jobs waiting for the thread or in the batch it runs (read on the loop)."""
        return len(self._waiting) + self._running

    def schedule_first(self, job: Job) -> None:
        """schedule(job), ahead of every waiting job not scheduled first (after those that were)."""
        self._waiting.insert(self._first, job)
        self._first += 1
        if type(job) is not self._kind:
            self._kind = type(job) if len(self._waiting) == 1 else Job
        if not self._busy:
            self._busy = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._run_waiting)

    def schedule(self, job: Job) -> None:
        """Run job on the thread; its done() is called on the event loop, later, never from inside
        this call."""
        self._waiting.append(job)
        if type(job) is not self._kind:  # (as it is when the job is the first, unless kind has it already)
            self._kind = type(job) if len(self._waiting) == 1 else Job
        if not self._busy:
            self._busy = True  # start on the next iteration: jobs scheduled in this one join the batch
            (self._loop or asyncio.get_running_loop()).call_soon(self._run_waiting)

    def _run_waiting(self) -> None:
        batch, kind = self._take_waiting()
        if not batch:
            return
        with self._shut_lock:
            if not self._shut:
                self._queue.put((batch, kind, self._loop or asyncio.get_running_loop()))
                return
        self._finish(batch, kind, _refused(len(batch)))

    def _take_waiting(self) -> tuple[list[Job], type[Job]]:
        """The waiting jobs, as the next batch, and their class; none (no longer busy) if every one
        was a call the application cancelled meanwhile: those do not run."""
        batch, kind = self._waiting, self._kind
        self._waiting = []
        self._first = 0
        if kind is _Call or kind is Job:
            batch = [job for job in batch if not (type(job) is _Call and job.future.cancelled())]
            if not batch:
                self._busy = False
        self._running = len(batch)
        return batch, kind

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            batch, kind, loop = item
            started = time.perf_counter()
            values = [_NEVER_RAN] * len(batch) if self._shut else _run_batch(batch, self._urgent)
            self.busy_seconds += time.perf_counter() - started
            try:
                loop.call_soon_threadsafe(self._finish, batch, kind, values)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _finish(self, batch: list[Job], kind: type[Job], values: list[Any]) -> None:
        # a mixed batch (a feed apply scheduled first among submissions): each run of one class together, so that
        # the submissions' appends still go out in one pass
        runs = [(kind, batch, values)] if kind is not Job else _runs(batch, values)
        for run_kind, jobs, run_values in runs:
            try:
                run_kind.done_all(jobs, run_values)
            except Exception:
                log.exception("callback-thread completion of a batch of %s failed", run_kind.__name__)
        while self._urgent:  # posted first after the thread's last look (it is idle now): they lead the next batch
            self.schedule_first(self._urgent.popleft())
        self._busy = False
        self._running = 0
        if self._waiting:  # scheduled while this batch ran: they go together, now
            self._busy = True
            self._next_batch()

    def _next_batch(self) -> None:
        self._run_waiting()

    def shutdown(self) -> None:
        """Stop the thread (waiting for a running job unless called from it); what has not run yet
        never will (futures of call() cancelled, other jobs told done(False, None))."""
        with self._shut_lock:
            self._shut = True
            self._queue.put(None)
        if not self.is_current():
            self._thread.join()


class LoopCallbacks(CallbackThread):
    """CallbackThread without the thread (client.callbackThread: false): every application callback and
    context hook runs on the event loop itself, for applications whose callbacks never block.

    The batching is the same (the jobs scheduled in one loop iteration run together, in order, on the
    next one, then their done_all in one pass), as are the outcomes (what a job raises goes to its
    done(); after shutdown() a job is refused with RuntimeError); only the two thread hops per batch
    are gone. A callback that blocks now stalls the whole client: its streams, timers and every
    other callback."""

    def __init__(self) -> None:  # no thread, no queue
        self._loop_thread: threading.Thread | None = None  # the loop's, once a batch ran there
        self._waiting = []
        self._first = 0
        self._kind = Job
        self._busy = False
        self._running = 0
        self._urgent = deque()  # (only from a done_all: the batch's jobs run on the loop, nothing comes between)
        self.busy_seconds = 0.0
        self._shut = False
        self._loop = None

    def is_current(self) -> bool:
        """Whether this is the loop's thread, on which the callbacks run."""
        return threading.current_thread() is self._loop_thread

    def _run_waiting(self) -> None:
        self._loop_thread = threading.current_thread()
        batch, kind = self._take_waiting()
        if batch:
            started = time.perf_counter()
            values = _refused(len(batch)) if self._shut else _run_batch(batch)
            self.busy_seconds += time.perf_counter() - started
            self._finish(batch, kind, values)

    def _next_batch(self) -> None:
        # on the next iteration, with whatever else it schedules: never a batch inside another's done_all
        (self._loop or asyncio.get_running_loop()).call_soon(self._run_waiting)

    def shutdown(self) -> None:
        """What has not run yet never will: it is refused (RuntimeError) when its batch comes."""
        self._shut = True


def callback_runner(threaded: bool, name: str) -> CallbackThread:
    """A CallbackThread named name, or (threaded False: client.callbackThread) LoopCallbacks."""
    return CallbackThread(name) if threaded else LoopCallbacks()


def _runs(batch: list[Job], values: list[Any]) -> list[tuple[type[Job], list[Job], list[Any]]]:
    """The batch cut into runs of consecutive jobs of one class, in order, with their values."""
    runs: list[tuple[type[Job], list[Job], list[Any]]] = []
    for job, value in zip(batch, values, strict=True):
        if runs and type(job) is runs[-1][0]:
            runs[-1][1].append(job)
            runs[-1][2].append(value)
        else:
            runs.append((type(job), [job], [value]))
    return runs


def _refused(count: int) -> list[Any]:
    """The values of a batch of count jobs that came after shutdown()."""
    return [_Raised(RuntimeError("the callback thread is shut down"))] * count


def _run_batch(batch: list[Job], urgent: deque[_Post] | None = None) -> list[Any]:
    """On the callback thread (or the loop: LoopCallbacks): each job in order; one that raises stops no other.
    Before each job and after the last, the jobs in urgent (CallbackThread.post_first while the batch runs)."""
    values: list[Any] = []
    for job in batch:
        if urgent:
            _run_posts(urgent)
        try:
            values.append(job.run())
        except BaseException as exc:  # handed to the caller, as run_in_executor does
            values.append(_Raised(exc))
    if urgent:
        _run_posts(urgent)
    return values


def _run_posts(posts: deque[_Post]) -> None:
    """Run the posts in order, here (a post's done() only logs what it raised: written from here)."""
    while posts:
        post = posts.popleft()
        try:
            post.run()
        except Exception as exc:
            post.done(False, exc)
