"""ReplicatedStorePartition over real in-process storage nodes and the real ZooKeeper: sessions, recovery,
quorum appends, catch-up, fencing and checkpoints."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import Record, ReqId, crc32
from waltz_common.zk import UNRESOLVED, ZkPaths
from waltz_server.store.api import AppendFailed, NewRecord, PendingRecord, StoreUnavailable
from waltz_server.store.connections import StorageConnections
from waltz_server.store.settings import StoreSettings
from waltz_server.store.store_partition import ReplicatedStorePartition
from waltz_server.store.wire import record_from_proto
from waltz_server.validation import req_id_message
from waltz_storage import server
from waltz_storage.dispatch import Limits
from waltz_storage.node import StorageNode
from waltz_storage.storage_manager import StorageManager

FAST = StoreSettings(
    initial_retry_interval_s=0.02, max_retry_interval_s=0.5, request_timeout_s=20.0, catch_up_batch_size=7
)
DEADLINE_S = 120.0


class Node:
    """A storage node served in the test's event loop; stop() drops its streams at once, like a crash."""

    def __init__(self, directory: Path, key: str, num_partitions: int) -> None:
        self.directory = directory
        self.key = uuid.UUID(key)
        self.num_partitions = num_partitions
        self.port = 0
        self.servers: server.NodeServers | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def assign(self, *partitions: int) -> None:
        """Create the partitions on disk (before start)."""
        with StorageManager(self.directory, self.key, self.num_partitions) as manager:
            for pid in partitions:
                manager.assign(pid)

    async def start(self) -> Node:
        node = StorageNode.open(
            self.directory,
            self.key,
            self.num_partitions,
            limits=Limits(1 << 20, 8 << 20),
            segment_size_threshold=1 << 30,
        )
        self.servers = await server.start(node, "127.0.0.1", self.port, 0)
        self.port = self.servers.storage_port
        return self

    async def stop(self) -> None:
        if self.servers is not None:
            servers, self.servers = self.servers, None
            await servers.stop(0)

    async def engine(self, partition_id: int, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(storage partition, *args) on the partition's own thread."""
        assert self.servers is not None
        node = self.servers.node
        return await node.run(partition_id, lambda: fn(node.manager.partition(partition_id), *args))

    async def records(self, partition_id: int) -> list[Record]:
        return list(await self.engine(partition_id, lambda p: p.records(0, 1_000_000)))


class Cluster:
    """ZooKeeper metadata plus storage nodes; every node holds a replica of partition 0."""

    def __init__(self, zk: KazooClient, root: str, tmp_path: Path, settings: StoreSettings = FAST) -> None:
        self.zk = zk
        self.paths = ZkPaths(root)
        self.key = cluster_admin.create_cluster(zk, self.paths, "store-test", 1)
        self.tmp_path = tmp_path
        self.settings = settings
        self.nodes: list[Node] = []
        self.connections = StorageConnections(self.key, 1, settings)
        self.partitions: list[ReplicatedStorePartition] = []

    async def add_node(self, *, assign_in_zookeeper: bool = True) -> Node:
        node = Node(self.tmp_path / f"node{len(self.nodes)}", self.key, 1)
        node.assign(0)
        await node.start()
        self.nodes.append(node)
        cluster_admin.add_storage_node(self.zk, self.paths, node.address, admin_port=1)
        if assign_in_zookeeper:
            await asyncio.to_thread(cluster_admin.assign_partitions, self.zk, self.paths, node.address, [0])
        return node

    def partition(self, settings: StoreSettings | None = None) -> ReplicatedStorePartition:
        store = ReplicatedStorePartition(
            0, zk=self.zk, paths=self.paths, connections=self.connections, settings=settings or self.settings
        )
        self.partitions.append(store)
        return store

    def metadata(self) -> metadata_pb2.PartitionMetadata:
        return zkmeta.require(self.zk, self.paths.partition_metadata(0), metadata_pb2.PartitionMetadata)[0]

    def replica_states(self) -> dict[str, tuple[int, int]]:
        return {
            e.replica_id.storage_node_connect_string: (
                e.replica_state.session_id,
                e.replica_state.closing_high_water_mark,
            )
            for e in self.metadata().replica_states
        }

    async def close(self) -> None:
        for store in self.partitions:
            await store.close()
        await self.connections.close()
        for node in self.nodes:
            await node.stop()


def run(scenario: Callable[[Cluster], Awaitable[None]], zk: KazooClient, root: str, tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(zk, root, tmp_path)
        try:
            async with asyncio.timeout(DEADLINE_S):
                await scenario(cluster)
        finally:
            await cluster.close()

    asyncio.run(main())


def pending(tag: str, count: int) -> list[PendingRecord]:
    data = [f"{tag}-{i}".encode() for i in range(count)]
    return [NewRecord(req_id_message(ReqId(7, 1, 0, i)), i, d, crc32(d)) for i, d in enumerate(data)]


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def append_retrying(store: ReplicatedStorePartition, records: list[PendingRecord]) -> int:
    """Append as the partition layer does: wait for a session, and after a failure trust recovery."""
    while True:
        try:
            return await store.append(records)
        except StoreUnavailable:
            await store.wait_ready(60)
        except AppendFailed as failure:
            await store.wait_ready(60)
            if store.high_water_mark >= failure.first_transaction_id + len(records) - 1:
                return failure.first_transaction_id
            assert store.high_water_mark < failure.first_transaction_id, "a batch committed only in part"


async def append_many(store: ReplicatedStorePartition, tag: str, batches: int, size: int) -> list[int]:
    return [await append_retrying(store, pending(f"{tag}{i}", size)) for i in range(batches)]


async def close_settled(store: ReplicatedStorePartition, replicas: int) -> None:
    """Close once every replica is in the write set (a session opens with a majority; others join later)."""
    await eventually(lambda: len(store.write_set()) == replicas, f"{replicas} replicas in the write set")
    await store.close()


async def identical(nodes: list[Node], high_water_mark: int) -> list[Record]:
    logs = [await n.records(0) for n in nodes]
    assert [len(log) for log in logs] == [high_water_mark + 1] * len(nodes)
    assert all(log == logs[0] for log in logs)
    assert [r.transaction_id for r in logs[0]] == list(range(high_water_mark + 1))
    return logs[0]


@pytest.fixture
def cluster_run(
    zk: KazooClient, cluster_root: str, tmp_path: Path
) -> Callable[[Callable[[Cluster], Awaitable[None]]], None]:
    return lambda scenario: run(scenario, zk, cluster_root, tmp_path)


def test_fresh_partition_opens_empty_and_appends_dense_ids_to_every_replica(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        assert store.high_water_mark == -1
        assert store.status().session_id == 0 and store.status().healthy
        assert await store.get_record(0) is None
        firsts = [await store.append(pending(f"b{i}", n)) for i, n in enumerate((1, 5, 2))]
        assert firsts == [0, 1, 6] and store.high_water_mark == 7
        got = [record_from_proto(r) for r in await store.get_records(0, 100)]
        assert [r.transaction_id for r in got] == list(range(8))
        assert got[1].data == b"b1-0" and got[1].req_id == ReqId(7, 1, 0, 0) and got[1].checksum == crc32(b"b1-0")
        assert [h.transaction_id for h in await store.get_headers(5, 10)] == [5, 6, 7]
        assert (await store.get_record(7)) == got[7] and await store.get_record(8) is None
        status = store.status()
        assert (status.replicas_connected, status.replicas_total, status.replicas_in_write_set) == (3, 3, 3)
        assert status.high_water_mark == 7
        metadata = c.metadata()
        assert (metadata.generation, metadata.session_id) == (1, 0)
        assert c.replica_states() == {n.address: (0, UNRESOLVED) for n in nodes}
        await close_settled(store, 3)
        assert await identical(nodes, 7) == got

    cluster_run(scenario)


def test_dead_replica_ends_session_appends_go_on_with_two_and_it_catches_up_on_return(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        await eventually(lambda: len(store.write_set()) == 3, "every replica in the write set")
        dead = nodes[2]
        writer = asyncio.create_task(append_many(store, "a", batches=40, size=3))
        await eventually(lambda: store.high_water_mark >= 20, "appends under way")
        await dead.stop()  # mid-stream: its session ends, the next one recovers and appends go on
        firsts = await writer
        assert firsts == list(range(0, 120, 3)) and store.high_water_mark == 119  # dense, none used twice
        session = store.status().session_id
        assert session >= 1 and c.metadata().session_id == session
        assert (store.status().replicas_in_write_set, store.status().replicas_total) == (2, 3)
        states = c.replica_states()
        assert states[nodes[0].address] == states[nodes[1].address] == (session, UNRESOLVED)
        # the dead replica keeps its old session, with the closing high-water mark recovery resolved
        dead_state = states[dead.address]
        assert dead_state[0] < session and 20 <= dead_state[1] <= store.high_water_mark

        await dead.start()
        await eventually(lambda: store.status().replicas_connected == 3, "the node is back")
        for i in range(3):
            await append_retrying(store, pending(f"c{i}", 2))  # the new session's appends reach it when it joins
        await eventually(lambda: len(store.write_set()) == 3, "the returning replica caught up and joined")
        assert c.replica_states()[dead.address] == (store.status().session_id, UNRESOLVED)
        await store.append(pending("d", 2))
        hwm = store.high_water_mark
        await close_settled(store, 3)
        log = await identical(nodes, hwm)
        assert log[-1].data == b"d-1"

    cluster_run(scenario)


def test_dirty_tail_on_one_replica_is_truncated_by_recovery(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        await store.append(pending("x", 4))
        await close_settled(store, 3)
        dirty = Record(4, ReqId(9, 1, 0, 1), 0, b"dirty", crc32(b"dirty"))
        await nodes[0].engine(0, lambda p: p.append([dirty]))
        assert len(await nodes[0].records(0)) == 5

        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        assert store.high_water_mark == 3  # one vote for 4 is not a majority of three
        assert await store.append(pending("y", 1)) == 4
        await close_settled(store, 3)
        log = await identical(nodes, 4)
        assert log[4].data == b"y-0"

    cluster_run(scenario)


def test_recovery_waits_while_undecidable_and_decides_when_a_replica_returns(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        await store.append(pending("x", 3))
        await close_settled(store, 3)
        await nodes[1].stop()
        await nodes[2].stop()

        store = c.partition()
        await store.start(1)
        with pytest.raises(StoreUnavailable):
            await store.wait_ready(1.0)  # one voter of three cannot decide
        await eventually(lambda: "undecidable" in store.status().detail, "recovery says why it waits")
        assert not store.status().healthy
        await nodes[2].start()
        await store.wait_ready(60)
        assert store.high_water_mark == 2
        assert await store.append(pending("y", 2)) == 3
        await close_settled(store, 2)
        await identical([nodes[0], nodes[2]], 4)

    cluster_run(scenario)


def test_a_newer_session_fences_the_older_one(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        old = c.partition()
        await old.start(1)
        await old.wait_ready(60)
        await old.append(pending("old", 2))
        old_session = old.status().session_id

        new = c.partition()
        await new.start(2)  # the partition moved to another server: higher generation
        await new.wait_ready(60)
        assert new.status().session_id == old_session + 1 and new.high_water_mark == 1
        with pytest.raises((AppendFailed, StoreUnavailable)):
            await old.append(pending("late", 1))
        await eventually(lambda: not old.status().healthy and "not the owner" in old.status().detail, "old fenced")
        assert await new.append(pending("new", 1)) == 2
        assert c.metadata().generation == 2 and c.metadata().session_id == new.status().session_id
        await close_settled(new, 3)
        log = await identical(nodes, 2)
        assert [r.data for r in log] == [b"old-0", b"old-1", b"new-0"]

    cluster_run(scenario)


def test_checkpoint_interval_forces_a_new_session(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        settings = StoreSettings(initial_retry_interval_s=0.02, max_retry_interval_s=0.5, checkpoint_interval=5)
        store = c.partition(settings)
        await store.start(1)
        await store.wait_ready(60)
        sessions = [store.status().session_id]
        firsts = []
        for i in range(7):
            firsts.append(await store.append(pending(f"c{i}", 2)))
            await store.wait_ready(60)
            sessions.append(store.status().session_id)
        assert firsts == list(range(0, 14, 2))
        # a new session after every 5 transactions: 6 after 3 batches, 6 more after 3 more
        assert sessions == [0, 0, 0, 1, 1, 1, 2, 2]
        assert c.metadata().session_id == 2
        # a session opens with a majority: a replica still recovering joins (and is marked) a little later
        expected = {n.address: (2, UNRESOLVED) for n in nodes}
        await eventually(lambda: c.replica_states() == expected, "every replica in session 2")
        await close_settled(store, 3)
        await identical(nodes, 13)

    cluster_run(scenario)


def test_a_replica_added_to_the_assignment_starts_a_session_and_catches_up(cluster_run: Any) -> None:
    async def scenario(c: Cluster) -> None:
        nodes = [await c.add_node() for _ in range(3)]
        store = c.partition()
        await store.start(1)
        await store.wait_ready(60)
        for i in range(4):
            await store.append(pending(f"a{i}", 5))
        session = store.status().session_id
        nodes.append(await c.add_node())  # the new node's assignment in ZooKeeper changes the replica set
        await eventually(lambda: store.status().replicas_total == 4 and store.status().session_id > session, "new")
        for i in range(3):
            await append_retrying(store, pending(f"b{i}", 5))
        await eventually(lambda: len(store.write_set()) == 4, "the new replica caught up and joined")
        assert c.replica_states()[nodes[3].address] == (store.status().session_id, UNRESOLVED)
        await store.append(pending("d", 5))
        hwm = store.high_water_mark
        assert hwm == 39
        await close_settled(store, 4)
        await identical(nodes, hwm)

    cluster_run(scenario)


def test_kill_9_of_a_storage_process_during_appends_loses_nothing_and_replicas_end_identical(
    zk: KazooClient, zookeeper: Any, cluster_root: str, tmp_path: Path
) -> None:
    cluster = LocalCluster(tmp_path, servers=0, zookeeper=zookeeper.connect_string, cluster_root=cluster_root)
    paths = cluster.paths
    try:
        cluster.start()
        victim = cluster.storage[1]

        async def scenario() -> None:
            connections = await StorageConnections.from_zookeeper(zk, paths, FAST)
            store = ReplicatedStorePartition(0, zk=zk, paths=paths, connections=connections)
            try:
                async with asyncio.timeout(DEADLINE_S):
                    await store.start(1)
                    await store.wait_ready(60)
                    writer = asyncio.create_task(append_many(store, "k", batches=60, size=5))
                    await eventually(lambda: store.high_water_mark >= 50, "appends under way")
                    await asyncio.to_thread(victim.kill)
                    assert await writer == list(range(0, 300, 5))
                    await asyncio.to_thread(victim.start)
                    await eventually(lambda: len(store.write_set()) == 3, "the killed node caught up and joined")
                    assert await store.append(pending("last", 3)) == 300
                    await close_settled(store, 3)
            finally:
                await store.close()
                await connections.close()

        asyncio.run(scenario())
    finally:
        cluster.stop()
    logs = []
    for node in cluster.storage:
        with StorageManager(node.directory, uuid.UUID(cluster.cluster_key), 1) as manager:
            logs.append(manager.partition(0).records(0, 1000))
    assert [len(log) for log in logs] == [303] * 3 and logs[0] == logs[1] == logs[2]
    assert [r.transaction_id for r in logs[0]] == list(range(303))
    bodies = {(node.directory / "0" / f"{0:019d}.seg").read_bytes()[128:] for node in cluster.storage}
    assert len(bodies) == 1  # the data files are byte-identical past their headers (creation time)
