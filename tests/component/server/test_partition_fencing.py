"""A newer owner fences this server's store session: the partition closes at once, its clients hear NOT_READY,
and it is not opened again here under the fenced generation (issue 26)."""

from __future__ import annotations

import asyncio

from waltz.v1 import server_pb2
from waltz_server.ownership import PartitionManager

from .fakes import FakeStore, FakeStream
from .harness import SMALL, run
from .helpers import mount


class Stores:
    """The manager's store factory, keeping every store it made."""

    def __init__(self) -> None:
        self.made: list[FakeStore] = []

    def __call__(self, partition_id: int) -> FakeStore:
        store = FakeStore(partition_id)
        self.made.append(store)
        return store


async def until(predicate, timeout: float = 10.0) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), timeout)


def test_a_fenced_partition_closes_at_once_tells_its_clients_and_is_not_reclaimed_under_its_generation():
    async def scenario():
        stores = Stores()
        manager = PartitionManager(2, stores, SMALL, restart_delay_s=0.1)
        await manager.apply({0: 1, 1: 1})
        partition = manager.get(0)
        assert partition is not None
        await partition.wait_ready(10)
        stream = FakeStream()
        partition.mount(stream, mount(generation=1))
        await stream.wait_for(lambda s: s.of("mount"))

        stores.made[0].fence()  # ZooKeeper still assigns partition 0 here: this server has not heard yet
        await until(lambda: manager.get(0) is None)
        ends = [m for m in stream.of("mount") if m.state == server_pb2.MountResponse.NOT_READY]
        assert [m.req_id for m in ends] == [mount().req_id]  # the client was told at once
        assert manager.fenced == 1 and manager.get(1) is not None  # the other partition is untouched

        await manager.apply({0: 1, 1: 1})  # the same (stale) assignment again: not reclaimed
        assert manager.get(0) is None
        await manager.apply({1: 1})  # the assignment moved it: the delayed retry must not reopen it
        await asyncio.sleep(0.5)
        assert manager.get(0) is None and len(stores.made) == 2

        await manager.apply({0: 3, 1: 1})  # given back under a newer generation: opened at once
        reopened = manager.get(0)
        assert reopened is not None and reopened.generation == 3
        await manager.close_all()

    run(scenario)


def test_a_fenced_partition_still_assigned_here_is_tried_again_after_the_delay():
    """A STALE_SESSION nobody else explains (the assignment still names this server, generation unchanged):
    the partition is opened again after the restart delay, and its store checks with ZooKeeper again."""

    async def scenario():
        stores = Stores()
        manager = PartitionManager(1, stores, SMALL, restart_delay_s=0.1)
        await manager.apply({0: 2})
        stores.made[0].fence()
        await until(lambda: manager.get(0) is None)
        await until(lambda: manager.get(0) is not None)
        assert len(stores.made) == 2 and manager.get(0).generation == 2
        await manager.close_all()

    run(scenario)
