"""Drive a LocalCluster for fault injection: a writer, a fresh consumer, replicas, ownership."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from tests.chaos.history import Append, compare_replicas
from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_client import AsyncWaltzClient, Transaction, WaltzClientCallbacks
from waltz_common import tls
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import Record, crc32
from waltz_storage.admin_client import StorageAdminClient

PARTITIONS = 4
# A killed server's ephemeral znode goes when its ZooKeeper session expires: 4 s is the least
# ZooKeeper grants with its 2 s tick. Reconnects to a restarted storage node retry at most 1 s apart.
SERVER_OVERRIDES = {
    "zookeeper.sessionTimeoutSeconds": 4.0,
    "storage.maxRetryInterval": 1000,
    "storage.maxBatchesInFlight": 3,  # faults land with several batches at the replicas
}
CLIENT = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 120, "client.requestTimeout": 120}
DEADLINE_S = 240.0


def chaos_cluster(
    workdir: Path,
    zookeeper: str,
    cluster_root: str,
    servers: int = 2,
    proxied: bool = False,
    tls: bool = False,
    **server_overrides: Any,
) -> LocalCluster:
    """The chaos tests' cluster; tls=True runs every channel with mutual TLS (development certificates)."""
    return LocalCluster(
        workdir,
        storage_nodes=3,
        servers=servers,
        partitions=PARTITIONS,
        zookeeper=zookeeper,
        cluster_root=cluster_root,
        server_overrides={**SERVER_OVERRIDES, **server_overrides},
        proxied=proxied,
        tls=tls,
    )


def run(scenario: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


async def until(predicate: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


class Recorder(WaltzClientCallbacks):
    """Keeps every applied transaction as a Record (data fetched), in the order it was applied."""

    def __init__(self) -> None:
        self.log: dict[int, list[Record]] = {}
        self.problems: list[str] = []
        self.exceptions: list[tuple[int, int, BaseException]] = []
        self._lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return len(self.log.get(partition_id, [])) - 1

    def apply_transaction(self, transaction: Transaction) -> None:
        data = transaction.data()
        with self._lock:
            records = self.log.setdefault(transaction.partition_id, [])
            if transaction.transaction_id != len(records):
                self.problems.append(
                    f"partition {transaction.partition_id}: applied id {transaction.transaction_id} "
                    f"after {len(records) - 1}"
                )
            records.append(
                Record(transaction.transaction_id, transaction.req_id, transaction.header, data, crc32(data))
            )

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        self.exceptions.append((partition_id, transaction_id, exc))


class Writer:
    """A stream of appends with unique payloads, round-robin over the partitions, until stopped."""

    def __init__(self, client: AsyncWaltzClient, fed: Recorder, pace_s: float = 0.002) -> None:
        self.client = client
        self.fed = fed  # what the writer's own client applied
        self.run_id = uuid.uuid4().hex[:8]
        self.pace_s = pace_s
        self.appends: list[Append] = []
        self.futures: list[asyncio.Future[bool]] = []
        self.acked_at: list[float] = []  # time.monotonic() of each acknowledgement, in order
        self.last_acked: dict[int, float] = {}  # partition -> time.monotonic() of its latest acknowledgement
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def acknowledged(self) -> int:
        return len(self.acked_at)

    def start(self, limit: int = 5000) -> None:
        self._task = asyncio.create_task(self._write(limit))

    async def _write(self, limit: int) -> None:
        while not self._stop.is_set() and len(self.appends) < limit:
            append = Append(self.run_id, len(self.appends), len(self.appends) % self.client.num_partitions)
            self.appends.append(append)
            try:
                future = await self.client.submit(append)
            except Exception as exc:  # never sent: no slot or no mount in time
                append.outcome = exc
                continue
            future.add_done_callback(append.settle)
            future.add_done_callback(partial(self._acknowledged, append))
            self.futures.append(future)
            await asyncio.sleep(self.pace_s)

    def acknowledgement_times(self) -> list[float]:
        return self.acked_at

    def partitions_acknowledged_since(self, moment: float) -> set[int]:
        return {p for p, t in self.last_acked.items() if t > moment}

    def _acknowledged(self, append: Append, future: asyncio.Future[bool]) -> None:
        if not future.cancelled() and future.exception() is None and future.result() is True:
            append.acked_at = time.monotonic()
            self.acked_at.append(append.acked_at)
            self.last_acked[append.partition % self.client.num_partitions] = append.acked_at

    async def acknowledged_at_least(self, count: int, what: str, timeout: float = 120.0) -> int:
        await until(lambda: self.acknowledged >= count, f"{count} acknowledged appends ({what})", timeout)
        return self.acknowledged

    async def stop(self, timeout: float = 150.0) -> None:
        """Stop submitting and wait until every submission has ended one way or another."""
        self._stop.set()
        if self._task is not None:
            await self._task
        if self.futures:
            await asyncio.wait(self.futures, timeout=timeout)


@contextlib.asynccontextmanager
async def writing(cluster: LocalCluster, limit: int = 100_000) -> AsyncIterator[Writer]:
    """A started Writer on its own client; stopped (every submission ended) on the way out."""
    fed = Recorder()
    async with AsyncWaltzClient(fed, {**cluster.client_config(), **CLIENT}) as client:
        await client.wait_mounted()
        writer = Writer(client, fed)
        writer.start(limit)
        try:
            yield writer
        finally:
            await writer.stop()


async def read_everything(config: dict[str, Any], timeout: float = 120.0) -> dict[int, list[Record]]:
    """The whole log up to each partition's high-water mark, as a fresh consumer is fed it."""
    recorder = Recorder()
    async with AsyncWaltzClient(recorder, config) as consumer:
        await consumer.wait_mounted()
        ends = {p: await consumer.high_water_mark(p) for p in range(consumer.num_partitions)}
        await until(
            lambda: all(consumer.client_high_water_mark(p) >= h for p, h in ends.items()),
            f"a fresh consumer reads up to {ends}",
            timeout,
        )
    assert not recorder.problems, recorder.problems
    log = {p: recorder.log.get(p, []) for p in range(PARTITIONS)}
    # nothing was written after the run: the consumer stops exactly at the high-water marks
    assert {p: len(records) - 1 for p, records in log.items()} == ends
    return log


def replica_records(cluster: LocalCluster) -> dict[str, dict[int, list[Record]]]:
    """Every storage node's records of every partition, through its admin port."""
    found: dict[str, dict[int, list[Record]]] = {}
    for node in cluster.storage:
        operator = cluster.tls_files("operator")
        with StorageAdminClient(
            "127.0.0.1", node.admin_port, cluster.cluster_key, PARTITIONS, tls_files=operator
        ) as admin:
            found[node.name] = node_records(admin)
    return found


async def assigned_replicas_hold_the_log(cluster: LocalCluster, log: dict[int, list[Record]],
                                         serving: dict[str, list[int]], timeout: float = 90.0) -> None:
    """Wait until every node in serving (name -> partitions assigned) holds exactly the log of those partitions (a
    replica may still be catching up the last batches); else fail with the differences."""
    problems: list[str] = []

    def identical() -> bool:
        problems[:] = [problem for name, records in replica_records(cluster).items() if name in serving
                       for problem in compare_replicas({name: records}, {p: log[p] for p in serving[name]})]
        return not problems

    try:
        await until(identical, "every assigned replica holds exactly the log", timeout=timeout)
    except AssertionError:
        raise AssertionError(problems) from None


def node_records(admin: StorageAdminClient) -> dict[int, list[Record]]:
    """Every record of every partition one storage node holds, read through its admin client."""
    partitions: dict[int, list[Record]] = {}
    for state in admin.list_partitions():
        records: list[Record] = []
        while len(records) <= state.max_transaction_id:
            chunk = admin.record_list(state.partition_id, len(records), 500)
            if not chunk:
                break
            records.extend(chunk)
        partitions[state.partition_id] = records
    return partitions


def segment_bodies(cluster: LocalCluster, partition_id: int) -> dict[str, bytes]:
    """Each stopped node's data files of a partition, past their headers (creation time differs)."""
    bodies = {}
    for node in cluster.storage:
        files = sorted((node.directory / str(partition_id)).glob("*.seg"))
        bodies[node.name] = b"".join(f.read_bytes()[128:] for f in files)
    return bodies


@dataclass(frozen=True)
class Ownership:
    server_id: int
    generation: int


def assignment(cluster: LocalCluster) -> dict[int, Ownership]:
    """<root>/partitions: partition -> (owning server id, generation)."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        message = zkmeta.require(zk, cluster.paths.server_assignment, metadata_pb2.ServerAssignment)[0]
    finally:
        zk.stop()
        zk.close()
    return {p.partition_id: Ownership(p.server_id, p.generation) for p in message.partitions}


async def server_partitions(cluster: LocalCluster, address: str) -> server_pb2.ServerPartitionsResponse:
    async with tls.aio_channel(address, cluster.tls_files("operator")) as channel:
        stub = server_pb2_grpc.WaltzServerStub(channel)
        return await stub.GetServerPartitions(server_pb2.ServerPartitionsRequest(), timeout=10)


async def sessions(cluster: LocalCluster) -> dict[int, tuple[int, int, int]]:
    """partition -> (generation, store session id, high-water mark) as its live owner reports them."""
    found = {}
    for server in cluster.servers:
        if server.running:
            for p in (await server_partitions(cluster, server.address)).partitions:
                found[p.partition_id] = (p.generation, p.session_id, p.high_water_mark)
    return dict(sorted(found.items()))


async def all_partitions(cluster: LocalCluster, healthy: bool, timeout: float = 60.0) -> None:
    """Wait until the live servers report every partition healthy (or every one unhealthy)."""
    states: dict[int, bool] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = {}
        for server in cluster.servers:
            if server.running:
                for p in (await server_partitions(cluster, server.address)).partitions:
                    states[p.partition_id] = p.healthy
        if len(states) == PARTITIONS and all(state == healthy for state in states.values()):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"partitions not all {'healthy' if healthy else 'unhealthy'} within {timeout:g} s: {states}")


async def servers_by_id(cluster: LocalCluster) -> dict[int, Any]:
    """server id -> its ServerNode, for the servers that are running."""
    found = {}
    for server in cluster.servers:
        if server.running:
            found[(await server_partitions(cluster, server.address)).server_id] = server
    return found


async def healthy_owners(
    cluster: LocalCluster, timeout: float = 90.0
) -> dict[int, server_pb2.ServerPartitionsResponse]:
    """Wait until ZooKeeper's assignment and the live servers agree and every partition is healthy;
    returns server id -> its GetServerPartitions answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            owners = await asyncio.to_thread(assignment, cluster)
            answers = {}
            for server in cluster.servers:
                if server.running:
                    answer = await server_partitions(cluster, server.address)
                    answers[answer.server_id] = answer
            held = {p.partition_id: (sid, p.generation, p.healthy) for sid, a in answers.items() for p in a.partitions}
            wanted = {pid: (o.server_id, o.generation, True) for pid, o in owners.items()}
            if len(owners) == PARTITIONS and held == wanted:
                return answers
            last = (owners, held)
        except (grpc.RpcError, zkmeta.MetadataError) as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"partitions not healthy at their owners within {timeout:g} s: {last}")
