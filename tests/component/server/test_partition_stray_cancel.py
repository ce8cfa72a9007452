"""A CancelledError out of the store that nobody asked for must not end the append task silently."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from waltz.v1 import server_pb2
from waltz_server.ownership import PartitionManager
from waltz_server.service import partition_status
from waltz_server.store.api import PendingRecord

from .fakes import FakeStore, FakeStream
from .harness import SMALL, mounted_client, run
from .helpers import append, mount


class CancellingStore(FakeStore):
    """Its next append raises CancelledError, as awaiting an already cancelled future does (cancel_next),
    or hands back an already cancelled commit future (cancel_commit_next)."""

    def __init__(self, partition_id: int) -> None:
        super().__init__(partition_id)
        self.cancel_next = False
        self.cancel_commit_next = False

    async def begin_append(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        if self.cancel_next or self.cancel_commit_next:
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            future.cancel()
            if self.cancel_commit_next:
                self.cancel_commit_next = False
                return future
            self.cancel_next = False
            return await future  # type: ignore[no-any-return]
        return await super().begin_append(records)

    def append_now(self, records: Sequence[PendingRecord]) -> asyncio.Future[int] | None:
        if self.cancel_next:
            return None  # begin_append raises it
        if self.cancel_commit_next:
            self.cancel_commit_next = False
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            future.cancel()
            return future
        return super().append_now(records)


@pytest.mark.parametrize("where", ["call", "commit"])
def test_a_stray_cancelled_error_from_the_store_is_reported_as_a_failure(where: str):
    async def scenario():
        partition, store, stream = await mounted_client(CancellingStore(0))
        if where == "call":
            store.cancel_next = True
        else:
            store.cancel_commit_next = True
        await partition.submit(stream, [append(seq=1)])
        for _ in range(200):
            if not partition.ready:
                break
            await asyncio.sleep(0.01)
        # before: the append task had ended without a word and the partition still said healthy
        status = partition_status(partition)
        assert not partition.ready and not status.healthy
        assert ("CancelledError" if where == "call" else "cancelled") in status.detail
        await partition.close()

    run(scenario)


def test_closing_the_partition_still_cancels_the_append_task_quietly():
    async def scenario():
        partition, _, _ = await mounted_client(CancellingStore(0))
        await partition.close()
        assert partition.failure == ""

    run(scenario)


def test_a_failed_partition_answers_its_queued_appends_and_is_opened_again():
    async def scenario():
        stores: list[CancellingStore] = []

        def store_for(pid: int) -> CancellingStore:
            stores.append(CancellingStore(pid))
            return stores[-1]

        manager = PartitionManager(1, store_for, SMALL, restart_delay_s=0.05)
        await manager.apply({0: 3})
        failed = manager.get(0)
        assert failed is not None
        await failed.wait_ready(10)
        stream = FakeStream()
        failed.mount(stream, mount(generation=3))
        await stream.wait_for(lambda s: s.of("mount"))
        stores[0].cancel_next = True
        await failed.submit(stream, [append(seq=1, generation=3)])
        for _ in range(500):
            if failed.closed:
                break
            await asyncio.sleep(0.01)
        # its feed on the stream ended, and the client is told so: an unasked NOT_READY for the mount that
        # started it, after everything the feed sent (before: nothing, and a client that only reads waited
        # for ever on a feed that was gone)
        await stream.wait_for(lambda s: len(s.of("mount")) == 2)
        ready, ended = stream.of("mount")
        assert ready.state == server_pb2.MountResponse.READY and ended.state == server_pb2.MountResponse.NOT_READY
        assert ended.req_id == ready.req_id == mount(generation=3).req_id
        assert stream.messages[-1].mount == ended
        # before: the failed partition stayed as it was until its ownership changed, taking appends that
        # were never answered (their clients waited for ever)
        await failed.submit(stream, [append(seq=2, generation=3)])
        assert stream.of("append_rejected")[0].reason == server_pb2.AppendRejected.PARTITION_NOT_READY
        for _ in range(500):
            again = manager.get(0)
            if again is not None and again is not failed and again.ready:
                break
            await asyncio.sleep(0.01)
        assert again is not None and again is not failed and again.ready and again.generation == 3
        assert len(stores) == 2 and partition_status(again).healthy
        fresh = FakeStream()
        again.mount(fresh, mount(generation=3))
        await fresh.wait_for(lambda s: s.of("mount"))
        await again.submit(fresh, [append(seq=3, generation=3)])
        await fresh.wait_for(lambda s: s.fed())
        await manager.close_all()

    run(scenario)
