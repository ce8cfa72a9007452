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
    """Runs every application callback and context hook, one at a time, on one thread."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._thread: threading.Thread | None = None
        self._executor.submit(self._remember_thread).result()

    def _remember_thread(self) -> None:
        self._thread = threading.current_thread()

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=not self.is_current(), cancel_futures=True)
