"""Membership with a real ZooKeeper: servers split the partitions; a leaver's move with generation + 1."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.component.server.fakes import FakeStore
from tests.component.server.harness import SMALL, run
from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_server.cluster import ClusterMembership
from waltz_server.health import identity_name
from waltz_server.liveness import LivenessSettings
from waltz_server.ownership import PartitionManager
from waltz_server.peers import PeerWatch

NUM_PARTITIONS = 4


class Member:
    """One server's membership over its own ZooKeeper session and FakeStores."""

    def __init__(self, connect_string: str, paths: ZkPaths, port: int, on_identity=None) -> None:
        self.zk = zkmeta.connect(connect_string, session_timeout_s=10)
        self.manager = PartitionManager(NUM_PARTITIONS, FakeStore, SMALL)
        self.connected: list[bool] = []

        async def on_connected(ok: bool) -> None:
            self.connected.append(ok)

        self.membership = ClusterMembership(
            self.zk, paths, "127.0.0.1", port, NUM_PARTITIONS, self.manager, on_connected, on_identity
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


def test_session_loss_keeps_the_partitions_still_assigned_and_a_new_session_registers_again(
    zookeeper, zk, cluster_root
):
    """Issue 32: a lost session no longer gives every partition up (their store sessions fence an old owner, not
    ZooKeeper). The server registers again under its id and keeps what is still assigned to it at the same
    generation: the same partition objects, never closed, so no new store session and no recovery."""
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
            await until(lambda: member.connected[-1] is True)
            await until(lambda: zk.exists(paths.server(server_id)) is not None)
            await asyncio.sleep(0.5)  # the assignment was read again meanwhile
            assert member.manager.all() == first_partitions
            assert not any(p.closed for p in first_partitions)
            assert set(member.owned().values()) == {1}
        finally:
            await member.stop()

    run(scenario, timeout=120)


FAST = LivenessSettings(probe_interval_s=0.05, refused_confirm_s=0.2, timeout_s=1.0, rejoin_s=0.5)


class Probed(Member):
    """A member whose client port is a real gRPC server answering health checks (what peers probe); closing
    the port is a kill -9 as its peers see it, while its membership (and ZooKeeper session) goes on."""

    def __init__(self, connect_string: str, paths: ZkPaths, port: int = 0) -> None:
        self.port_number = port
        self.health: grpc.aio.Server | None = None
        self.servicer = health.aio.HealthServicer()
        self.server_id = -1
        self._connect_string, self._paths = connect_string, paths

    async def open_port(self) -> None:
        server = grpc.aio.server()
        self.servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        if self.server_id >= 0:
            await self._identity(self.server_id)
        self.port_number = server.add_insecure_port(f"127.0.0.1:{self.port_number}")
        await server.start()
        self.health = server

    async def _identity(self, server_id: int) -> None:
        """What a server does before it registers: answer its identity name (what peers probe)."""
        self.server_id = server_id
        await self.servicer.set(identity_name(server_id), health_pb2.HealthCheckResponse.SERVING)

    async def close_port(self) -> None:
        assert self.health is not None
        await self.health.stop(0)

    async def start(self) -> int:
        await self.open_port()
        Member.__init__(self, self._connect_string, self._paths, self.port_number, self._identity)
        self.membership._peers = PeerWatch(FAST)
        return await self.membership.start()

    async def stop(self) -> None:
        await Member.stop(self)
        if self.health is not None:
            await self.health.stop(0)


def test_a_dead_server_still_registered_loses_its_partitions_and_a_dead_coordinator_is_replaced(
    zookeeper, zk, cluster_root
):
    """Detection without ZooKeeper: closing a server's client port (its session lives on) moves its partitions
    with generation + 1 within about a second; the server, still registered, lets them go and does not take
    them back; once its port answers again the coordinator gives it a share under newer generations. Then
    the same with the coordinator as the dead one: the other server takes its place."""
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", NUM_PARTITIONS)

    async def scenario():
        first = Probed(zookeeper.connect_string, paths)
        second = Probed(zookeeper.connect_string, paths)
        try:
            a = await first.start()
            b = await second.start()
            await until(lambda: len(first.owned()) == 2 and len(second.owned()) == 2)
            await asyncio.sleep(0.3)  # both have answered a probe: they are judged from now on
            held = second.owned()

            loop = asyncio.get_running_loop()
            await second.close_port()
            closed_at = loop.time()
            await until(lambda: len(first.owned()) == NUM_PARTITIONS, timeout=10)
            took = loop.time() - closed_at
            assert took < 1.5, took
            assert zk.exists(paths.server(b)) is not None  # still registered
            assert all(first.owned()[p] == g + 1 for p, g in held.items())
            await until(lambda: second.owned() == {})  # it saw the assignment move and let them go
            await asyncio.sleep(0.5)
            assert second.owned() == {} and {s for s, _ in assignment(zk, paths).values()} == {a}

            await second.open_port()  # back: after peerRejoin the coordinator rebalances, newer generations
            await until(lambda: len(second.owned()) == 2, timeout=10)
            assert all(g >= 3 for g in second.owned().values())

            taken = first.owned()
            await first.close_port()  # now the coordinator (the smallest id) is the dead one
            await until(lambda: len(second.owned()) == NUM_PARTITIONS, timeout=10)
            assert all(second.owned()[p] == g + 1 for p, g in taken.items())
            await until(lambda: first.owned() == {})
        finally:
            await second.stop()
            await first.stop()

    run(scenario, timeout=120)


def test_a_server_restarted_at_once_on_a_dead_coordinators_address_does_not_keep_its_ghost_alive(
    zookeeper, zk, cluster_root
):
    """Issue 32's ghost: the coordinator is killed (its ZooKeeper session lives on) and a new server process starts
    at once on its address. Before, the new process answered the probes of the old address, so the dead server
    looked alive, stayed coordinator (the smallest id) and nothing moved until its session expired. Now the new
    process deletes the registration that names its address, and the probes ask for the old id, which the new
    process does not answer: the survivor coordinates and moves the dead server's partitions at once."""
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", NUM_PARTITIONS)

    async def scenario():
        first = Probed(zookeeper.connect_string, paths)
        second = Probed(zookeeper.connect_string, paths)
        third: Probed | None = None
        try:
            a = await first.start()
            b = await second.start()
            await until(lambda: len(first.owned()) == 2 and len(second.owned()) == 2)
            await asyncio.sleep(0.3)  # both have answered a probe as themselves
            await first.close_port()  # killed: its session lives on, as a killed process's does for a while
            third = Probed(zookeeper.connect_string, paths, first.port_number)
            c = await third.start()  # at once, on the same address, under a new id
            await until(lambda: zk.exists(paths.server(a)) is None, timeout=10)
            await until(lambda: {s for s, _ in assignment(zk, paths).values()} == {b, c}, timeout=10)
            await until(lambda: len(second.owned()) + len(third.owned()) == NUM_PARTITIONS, timeout=10)
        finally:
            if third is not None:
                await third.stop()
            await second.stop()
            await first.stop()

    run(scenario, timeout=120)


def test_a_server_whose_session_alone_expired_keeps_its_partitions_while_it_registers_again(
    zookeeper, zk, cluster_root
):
    """A frozen ZooKeeper, woken, expires the sessions whose clients have not reconnected yet: here only the
    second server's. It still answers its peers as itself, SERVING, so the coordinator does not move its
    partitions while it registers again (before: moved to the coordinator and back, two new generations)."""
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", NUM_PARTITIONS)

    async def scenario():
        first = Probed(zookeeper.connect_string, paths)
        second = Probed(zookeeper.connect_string, paths)
        try:
            await first.start()
            b = await second.start()
            await until(lambda: len(first.owned()) == 2 and len(second.owned()) == 2)
            await asyncio.sleep(0.3)  # both have answered a probe as themselves
            before = assignment(zk, paths)
            kept = second.manager.all()
            await asyncio.to_thread(expire_session, zookeeper.connect_string, second.zk)
            await until(lambda: False in second.connected)
            await until(lambda: second.connected[-1] is True and zk.exists(paths.server(b)) is not None)
            await asyncio.sleep(2 * FAST.timeout_s)  # past the grace: anything still to move has moved
            assert assignment(zk, paths) == before
            assert second.manager.all() == kept and not any(p.closed for p in kept)
        finally:
            await second.stop()
            await first.stop()

    run(scenario, timeout=120)
