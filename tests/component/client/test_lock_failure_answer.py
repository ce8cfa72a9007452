"""A lock failure's answer (the on_lock_failure hook) is not queued behind the execute() calls waiting on the
callback thread (issue 31: with PostgreSQL each execute() is a database round trip, and the hook of an instance
with 20 submitters waited for a batch of them: answers p50/p99 24/274 ms while the LockFailure reached the loop
at 9/50 ms)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from tests.component.client.helpers import Ctx, client, eventually, run
from waltz_client import MockServer, PartitionLocalLock, TransactionBuilder


@pytest.mark.callback_modes("thread")  # an execute() blocks the callback thread
@pytest.mark.parametrize("waiting", ["in the next batch", "in the running batch"])
def test_the_lock_failure_hook_goes_ahead_of_waiting_executes(waiting: str) -> None:
    """The hook goes ahead of the execute() calls waiting for the thread, and of those of the batch the thread
    runs (between two of its jobs): it waits for the execute() running only."""
    order: list[str] = []
    gate = threading.Event()

    class Recorded(Ctx):
        def execute(self, builder: TransactionBuilder) -> bool:
            order.append("execute " + self.data.decode())
            return super().execute(builder)

        def on_lock_failure(self) -> None:
            order.append("lock failure " + self.data.decode())
            super().on_lock_failure()

    def blocks(_builder: TransactionBuilder) -> bool:
        gate.wait(10)
        return True

    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            await c.submit(Ctx(b"warm-up"))
            await c.flush()
            server.hold_requests()
            failing = Recorded(b"a", write=[PartitionLocalLock("item", 1)])
            futures: list[asyncio.Future[Any]] = [await c.submit(failing)]
            await eventually(lambda: bool(failing.executed_at))
            futures.append(await c.submit(Recorded(b"blocker", result=blocks)))
            if waiting == "in the next batch":
                await eventually(lambda: "execute blocker" in order)
            futures += [await c.submit(Recorded(b"c%d" % i)) for i in range(5)]  # waiting on the thread
            await eventually(lambda: "execute blocker" in order)
            await asyncio.sleep(0.05)
            server.force_next_lock_fail()
            server.release_requests()
            await eventually(lambda: c.stats.lock_failures == 1)
            await asyncio.sleep(0.05)
            gate.set()
            assert await asyncio.gather(*futures) == [True] * 7
        after = order[order.index("execute blocker") + 1:]
        assert after[0] == "lock failure a", order  # before: after the five waiting executes
        assert after[1:6] == [f"execute c{i}" for i in range(5)]

    run(main())
