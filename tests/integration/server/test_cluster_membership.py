"""Membership with a real ZooKeeper: servers split the partitions; a leaver's move with generation + 1."""

from __future__ import annotations

import asyncio

from tests.component.server.fakes import FakeStore
from tests.component.server.harness import SMALL, run
from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_server.cluster import ClusterMembership
from waltz_server.ownership import PartitionManager

NUM_PARTITIONS = 4


class Member:
    """One server's membership over its own ZooKeeper session and FakeStores."""

    def __init__(self, connect_string: str, paths: ZkPaths, port: int) -> None:
        self.zk = zkmeta.connect(connect_string, session_timeout_s=10)
        self.manager = PartitionManager(NUM_PARTITIONS, FakeStore, SMALL)
        self.connected: list[bool] = []

        async def on_connected(ok: bool) -> None:
            self.connected.append(ok)

        self.membership = ClusterMembership(
            self.zk, paths, "127.0.0.1", port, NUM_PARTITIONS, self.manager, on_connected
        )

    def owned(self) -> dict[int, int]:
        return self.manager.owned()

    async def stop(self) -> None:
        await self.membership.stop()
        await self.manager.close_all()
        await asyncio.to_thread(self.zk.stop)
        self.zk.close()


async def until(predicate, timeout: float = 30.0) -> None:
    async def loop() -> None:
        while not predicate():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), timeout)


def assignment(zk, paths: ZkPaths) -> dict[int, tuple[int, int]]:
    message = zkmeta.require(zk, paths.server_assignment, metadata_pb2.ServerAssignment)[0]
    return {p.partition_id: (p.server_id, p.generation) for p in message.partitions}


def test_two_servers_split_partitions_and_a_leavers_partitions_move_with_a_new_generation(zookeeper, zk, cluster_root):
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", NUM_PARTITIONS)

    async def scenario():
        first = Member(zookeeper.connect_string, paths, 7001)
        second = Member(zookeeper.connect_string, paths, 7002)
        try:
            a = await first.membership.start()
            await until(lambda: len(first.owned()) == NUM_PARTITIONS)
            assert first.owned() == {p: 1 for p in range(NUM_PARTITIONS)}
            descriptor = zkmeta.require(zk, paths.server(a), metadata_pb2.ServerDescriptor)[0]
            assert (descriptor.server_id, descriptor.host, descriptor.port) == (a, "127.0.0.1", 7001)

            b = await second.membership.start()
            assert b > a
            await until(lambda: len(first.owned()) == 2 and len(second.owned()) == 2)
            moved = second.owned()
            assert set(first.owned()) | set(moved) == set(range(NUM_PARTITIONS))
            assert all(generation == 2 for generation in moved.values())
            assert all(generation == 1 for generation in first.owned().values())
            stored = assignment(zk, paths)
            assert {p: s for p, (s, _) in stored.items()} == {
                **{p: a for p in first.owned()},
                **{p: b for p in moved},
            }
            for partition in second.manager.all():
                await partition.wait_ready(10)
                assert partition.generation == 2

            await second.stop()
            await until(lambda: len(first.owned()) == NUM_PARTITIONS)
            back = first.owned()
            assert all(back[p] == 3 for p in moved) and all(back[p] == 1 for p in back if p not in moved)
            assert zk.exists(paths.server(b)) is None
        finally:
            await second.stop() if second.zk.connected else None
            await first.stop()

    run(scenario, timeout=120)


def expire_session(connect_string: str, victim) -> None:
    """End victim's ZooKeeper session from outside, as a long network partition would."""
    from kazoo.client import KazooClient

    session_id, password = victim.client_id
    other = KazooClient(hosts=connect_string, client_id=(session_id, password))
    other.start(timeout=10)
    other.stop()
    other.close()


def test_session_loss_gives_up_partitions_and_a_new_session_registers_again(zookeeper, zk, cluster_root):
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", NUM_PARTITIONS)

    async def scenario():
        member = Member(zookeeper.connect_string, paths, 7003)
        try:
            server_id = await member.membership.start()
            await until(lambda: len(member.owned()) == NUM_PARTITIONS)
            first_partitions = member.manager.all()
            await asyncio.to_thread(expire_session, zookeeper.connect_string, member.zk)
            await until(lambda: False in member.connected)
            await until(lambda: member.connected[-1] is True and len(member.owned()) == NUM_PARTITIONS)
            assert all(p.closed for p in first_partitions)  # the old objects were closed on LOST
            assert zk.exists(paths.server(server_id)) is not None
            assert set(member.owned().values()) == {1}
        finally:
            await member.stop()

    run(scenario, timeout=120)
