"""A change counter that coroutines can wait on without missing a change (edge-free notification)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Signal:
    """notify() bumps version and wakes every waiter; wait_past(v) returns once version != v."""

    def __init__(self) -> None:
        self.version = 0
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_past(self, version: int) -> None:
        while self.version == version:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)


async def first_to_end(*coros: Coroutine[Any, Any, Any]) -> None:
    """Run coros as tasks until one of them ends; cancel the others and wait for them; then return or raise
    as that first one did (if several ended together, an exception beats a return).

    For a retry loop, instead of a TaskGroup whose errors are caught to try again: on Python 3.11 a
    cancellation that reaches a task while its TaskGroup is aborting (a child failed) is swallowed, so the
    loop would go on with the cancellation lost. Here a cancelled caller cancels every coro and the
    CancelledError goes on up."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # a second cancellation of the caller here still propagates
    failed = [t for t in tasks if t in done and not t.cancelled() and t.exception() is not None]
    (failed[0] if failed else next(iter(done))).result()
