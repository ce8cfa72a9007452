"""Issue 33: bytes flipped in committed records on disk never erase acknowledged transactions.

A real cluster (ZooKeeper, 3 storage nodes, a server, one partition) commits transactions; then bytes of
committed records are flipped in the storage nodes' data files, offline (nodes stopped) and online (under
a running node), and nodes and the server restart. What must hold: every acknowledged transaction is read
back with its own bytes by a fresh consumer (0 lost, 0 damaged bytes served), the damage is repaired from
the healthy replicas (the replicas end identical), and `waltz cluster verify` fails while damage is there
and passes once it is repaired.

The default run does each scenario once; WALTZ_SLOW=1 does each 10 times.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks
from tests.unit.cli.helpers import Run, waltz
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster, StorageNode
from waltz_storage.admin_client import StorageAdminClient

SLOW = os.environ.get("WALTZ_SLOW") == "1"
RUNS = 10 if SLOW else 1
COMMITTED = 900
FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 120, "client.requestTimeout": 120}
RECORD_DATA = 36  # offset of the data in a record (docs/storage-format.md)


def payload(run: str, i: int) -> bytes:
    return f"{run}-{i:06d}".encode()


def append(cluster: LocalCluster, run: str, first: int, n: int) -> list[int]:
    """Commit n transactions carrying payload(run, first..first+n-1); the ids they were given, in order."""

    async def main() -> list[int]:
        callbacks = MemoryCallbacks()
        async with AsyncWaltzClient(callbacks, {**cluster.client_config(), **FAST}) as client:
            await client.wait_mounted()
            futures = [await client.submit(Ctx(payload(run, first + i))) for i in range(n)]
            assert all(await asyncio.gather(*futures))
        return [int(txn) for txn, _ in callbacks.applied.get(0, [])]

    return asyncio.run(asyncio.wait_for(main(), 240))


def read_all(cluster: LocalCluster) -> list[bytes]:
    """Every transaction up to the partition's high-water mark, as a fresh consumer is fed it."""

    async def main() -> list[bytes]:
        callbacks = MemoryCallbacks()
        async with AsyncWaltzClient(callbacks, {**cluster.client_config(), **FAST}) as client:
            await client.wait_mounted()
            end = int(await client.high_water_mark(0))
            deadline = time.monotonic() + 120
            while client.client_high_water_mark(0) < end:
                assert time.monotonic() < deadline, f"a fresh consumer did not read up to {end}"
                await asyncio.sleep(0.05)
        return [data for _, data in callbacks.applied.get(0, [])]

    return asyncio.run(asyncio.wait_for(main(), 240))


def record_offset(node: StorageNode, txn: int) -> tuple[Path, int]:
    """The data file holding txn on node and the record's byte offset in it (through the segment's index)."""
    directory = node.directory / "0"
    firsts = sorted(int(p.stem) for p in directory.glob("*.seg"))
    first = max(f for f in firsts if f <= txn)
    index = (directory / f"{first:019d}.idx").read_bytes()
    (offset,) = struct.unpack_from(">q", index, 128 + 8 * (txn - first))
    return directory / f"{first:019d}.seg", offset


def flip(node: StorageNode, txn: int, at: int = RECORD_DATA + 2) -> None:
    """Flip one byte of txn's record on node, `at` bytes into the record (by default inside its data)."""
    path, offset = record_offset(node, txn)
    with path.open("r+b") as f:
        f.seek(offset + at)
        byte = f.read(1)
        f.seek(offset + at)
        f.write(bytes([byte[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


def cli(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        return waltz(capsys, "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--timeout", "5", *argv)

    return run


def node_records(cluster: LocalCluster) -> dict[str, list[tuple[int, bytes]]]:
    """Each storage node's (id, data) of partition 0, read through its admin port (checksums verified)."""
    found = {}
    for node in cluster.storage:
        with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 1) as admin:
            (state,) = admin.list_partitions()
            records: list[tuple[int, bytes]] = []
            while len(records) <= state.max_transaction_id:
                try:
                    chunk = admin.record_list(0, len(records), 500)
                except Exception as e:  # a damaged record: what it holds is not identical
                    records.append((len(records), f"unreadable: {e}".encode()))
                    continue
                if not chunk:
                    break
                records.extend((r.transaction_id, r.data) for r in chunk)
        found[node.name] = records
    return found


def replicas_identical(cluster: LocalCluster, expected: list[bytes], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    want = list(enumerate(expected))
    while True:
        found = node_records(cluster)
        wrong = {n: next((r for r, w in zip(rs, want, strict=False) if r != w), len(rs)) for n, rs in found.items()}
        if all(rs == want for rs in found.values()):
            return
        assert time.monotonic() < deadline, f"replicas not identical to the log (first difference): {wrong}"
        time.sleep(0.5)


@pytest.fixture
def cluster(zookeeper, tmp_path) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path / "cluster",
        storage_nodes=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        cluster_root=f"/test/{uuid.uuid4().hex[:12]}",
    ) as running:
        yield running


def whole_cluster_restart(cluster: LocalCluster, damage: Callable[[], None]) -> None:
    """Stop the server and the storage nodes, do the damage on disk, start the nodes and then the server."""
    for server in cluster.servers:
        server.stop()
    for node in cluster.storage:
        node.stop()
    damage()
    for node in cluster.storage:
        node.start()
    for server in cluster.servers:
        server.start()


def check_log(cluster: LocalCluster, expected: list[bytes], run: str) -> None:
    """Every acknowledged transaction, with its own bytes; then the log takes new appends after them."""
    log = read_all(cluster)
    lost = [i for i, data in enumerate(expected) if i >= len(log) or log[i] != data]
    assert not lost, f"{len(lost)} acknowledged transactions lost/changed, first {lost[:5]}; log ends at {len(log) - 1}"
    assert len(log) == len(expected), f"the log holds {len(log)} transactions, {len(expected)} were acknowledged"
    ids = append(cluster, run + "-after", 0, 5)
    assert ids[-5:] == list(range(len(expected), len(expected) + 5)), ids[-5:]
    expected.extend(payload(run + "-after", i) for i in range(5))


@pytest.mark.parametrize("attempt", range(RUNS))
def test_two_replicas_damaged_at_different_records_and_a_whole_cluster_restart_lose_nothing(cluster, attempt):
    """The issue's scenario: 900 committed on 3 replicas; one byte flipped in transaction 100 on replica B and in
    transaction 500 on replica C while everything is stopped; the whole cluster restarts."""
    run = uuid.uuid4().hex[:6]
    append(cluster, run, 0, COMMITTED)
    expected = [payload(run, i) for i in range(COMMITTED)]
    whole_cluster_restart(cluster, lambda: (flip(cluster.storage[1], 100), flip(cluster.storage[2], 500)))
    check_log(cluster, expected, run)
    replicas_identical(cluster, expected)
