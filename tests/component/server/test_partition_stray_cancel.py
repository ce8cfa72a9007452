"""A CancelledError out of the store that nobody asked for must not end the append task silently."""

from __future__ import annotations

import asyncio

from waltz_server.service import partition_status
from waltz_server.store.api import PendingRecord

from .fakes import FakeStore
from .harness import mounted_client, run
from .helpers import append


class CancellingStore(FakeStore):
    """Its next append raises CancelledError, as awaiting an already cancelled future does."""

    def __init__(self, partition_id: int) -> None:
        super().__init__(partition_id)
        self.cancel_next = False

    async def append(self, records: list[PendingRecord]) -> int:
        if self.cancel_next:
            self.cancel_next = False
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.cancel()
            return await future  # type: ignore[return-value]
        return await super().append(records)


def test_a_stray_cancelled_error_from_the_store_is_reported_as_a_failure():
    async def scenario():
        partition, store, stream = await mounted_client(CancellingStore(0))
        store.cancel_next = True
        await partition.submit(stream, [append(seq=1)])
        for _ in range(200):
            if not partition.ready:
                break
            await asyncio.sleep(0.01)
        # before: the append task had ended without a word and the partition still said healthy
        status = partition_status(partition)
        assert not partition.ready and not status.healthy
        assert "CancelledError" in status.detail
        await partition.close()

    run(scenario)


def test_closing_the_partition_still_cancels_the_append_task_quietly():
    async def scenario():
        partition, _, _ = await mounted_client(CancellingStore(0))
        await partition.close()
        assert partition.failure == ""

    run(scenario)
