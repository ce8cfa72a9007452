"""A change counter that coroutines can wait on without missing a change (edge-free notification)."""

from __future__ import annotations

import asyncio


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
