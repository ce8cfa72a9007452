"""Issue 33: bytes flipped in committed records on disk never erase acknowledged transactions.

A real cluster (ZooKeeper, 3 storage nodes, a server, one partition) commits transactions; then bytes of
committed records are flipped in the storage nodes' data files, offline (nodes stopped) and online (under
a running node), and nodes and the server restart. What must hold: every acknowledged transaction is read
back with its own bytes by a fresh consumer (0 lost, 0 damaged bytes served), the damage is repaired from
the healthy replicas (the replicas end identical), and `waltz cluster verify` fails while damage is there
and passes once it is repaired.

The storage invariants too: a low-water mark above a replica's max (which a previous-release server sets before it
copies the replica up, issue 44) does not keep that replica out for ever, and a replica whose fence is above the
partition's newest session is left out while the other two serve on.

The default run does the issue's scenario (two replicas damaged at different records, whole-cluster restart),
the online one and the invariants once each (62 s on the 2-core machine); WALTZ_SLOW=1 does
every damage scenario 10 times.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.cluster import server_partitions
from tests.component.client.helpers import Ctx, MemoryCallbacks
from tests.integration.cli.test_cli_cluster import until
from tests.integration.storage.test_storage_process import SyncSession
from tests.unit.cli.helpers import Run, waltz
from waltz.v1 import storage_pb2
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster, StorageNode
from waltz_storage.admin_client import StorageAdminClient

SLOW = os.environ.get("WALTZ_SLOW") == "1"
RUNS = 10 if SLOW else 1
COMMITTED = 900
FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 120, "client.requestTimeout": 120}
RECORD_DATA = 36  # offset of the data in a record (docs/storage-format.md)
SCRUB_INTERVAL_S = 2.0


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
        server_overrides={"storage.damageCheckIntervalSeconds": 1.0, "storage.maxRetryInterval": 1000},
        storage_overrides={"storage.scrub.intervalSeconds": SCRUB_INTERVAL_S},
    ) as running:
        yield running


def stop_all(cluster: LocalCluster) -> None:
    for server in cluster.servers:
        server.stop()
    for node in cluster.storage:
        node.stop()


def start_nodes(cluster: LocalCluster) -> None:
    for node in cluster.storage:
        if not node.running:
            node.start()


def start_servers(cluster: LocalCluster) -> None:
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


def verify_fails_naming_damage(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    found = cli(cluster, capsys)("cluster", "verify")
    assert found.code == 1 and "damaged records" in found.out, found.out


def verify_passes(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    found = until(lambda: cli(cluster, capsys)("cluster", "verify"))
    assert found.code == 0, found.out + found.err


# case -> (replica index -> the transactions flipped there; lagging replica; the intact replica frozen)
OFFLINE_CASES = {
    "one replica damaged": ({1: [100]}, None, False),
    "two replicas damaged at different records": ({1: [100], 2: [500]}, None, False),
    "one damaged and one lagging replica": ({1: [100]}, 2, False),
    "one damaged and one lagging replica, the intact one frozen": ({1: [100]}, 2, True),
    "two damaged, the intact one frozen": ({1: [100], 2: [500]}, None, True),
}


DEFAULT_CASES = ("two replicas damaged at different records",)  # the scenario; the rest: WALTZ_SLOW=1


@pytest.mark.parametrize("attempt", range(RUNS))
@pytest.mark.parametrize("case", list(OFFLINE_CASES) if SLOW else DEFAULT_CASES)
def test_bytes_flipped_offline_then_a_whole_cluster_restart_lose_nothing(cluster, capsys, case, attempt):
    """900 committed (the lagging replica down for the last 400); then, with every process stopped, one byte
    flipped in committed records' data; the storage nodes start (verify fails, naming the damage), the
    intact replica frozen if the case says so, then the server: every acknowledged transaction is read
    back with its own bytes, the damage is repaired, the replicas are identical and verify passes."""
    flips, lagging, frozen = OFFLINE_CASES[case]
    run = uuid.uuid4().hex[:6]
    if lagging is None:
        append(cluster, run, 0, COMMITTED)
    else:
        append(cluster, run, 0, 500)
        cluster.storage[lagging].stop()
        append(cluster, run, 500, COMMITTED - 500)
    expected = [payload(run, i) for i in range(COMMITTED)]
    stop_all(cluster)
    for index, txns in flips.items():
        for txn in txns:
            flip(cluster.storage[index], txn)
    start_nodes(cluster)
    verify_fails_naming_damage(cluster, capsys)
    intact = cluster.storage[0]
    if frozen:
        assert intact.pid is not None
        os.kill(intact.pid, signal.SIGSTOP)  # frozen, not dead: its connections stay up, it answers nothing
    try:
        start_servers(cluster)
        check_log(cluster, expected, run)
    finally:
        if frozen:
            assert intact.pid is not None
            os.kill(intact.pid, signal.SIGCONT)
    replicas_identical(cluster, expected)
    verify_passes(cluster, capsys)


@pytest.mark.parametrize("attempt", range(RUNS))
def test_a_byte_flipped_under_a_running_node_is_found_by_scrubbing_and_repaired(cluster, capsys, attempt):
    """A flip in a committed record's data under a running node (no read touches it): scrubbing finds it within
    its interval, the server's damage check restarts the store session, recovery repairs it; nothing is lost,
    through a whole-cluster restart after it too."""
    run = uuid.uuid4().hex[:6]
    append(cluster, run, 0, COMMITTED)
    expected = [payload(run, i) for i in range(COMMITTED)]
    for server in cluster.servers:
        server.stop()  # verify must see the damage before anything repairs it
    node = cluster.storage[1]
    flip(node, 300)
    flipped = time.monotonic()
    while not damaged_ids(cluster, 1):
        assert time.monotonic() - flipped < SCRUB_INTERVAL_S + 30, "scrubbing did not find the flip"
        time.sleep(0.2)
    found_after = time.monotonic() - flipped
    with capsys.disabled():
        print(f"\n[damage] scrubbing found the flip after {found_after:.1f} s (interval {SCRUB_INTERVAL_S:g} s)")
    assert found_after <= SCRUB_INTERVAL_S + 30
    assert damaged_ids(cluster, 1) == [300]
    verify_fails_naming_damage(cluster, capsys)
    start_servers(cluster)
    check_log(cluster, expected, run)
    replicas_identical(cluster, expected)
    verify_passes(cluster, capsys)
    if SLOW:  # and through a whole-cluster restart after it
        stop_all(cluster)
        start_nodes(cluster)
        start_servers(cluster)
        check_log(cluster, expected, run + "x")
        replicas_identical(cluster, expected)


def damaged_ids(cluster: LocalCluster, index: int) -> list[int]:
    with StorageAdminClient("127.0.0.1", cluster.storage[index].admin_port, cluster.cluster_key, 1) as admin:
        (state,) = admin.list_partitions()
    return list(state.damaged_transaction_ids)


def test_a_low_water_mark_above_the_max_comes_down_again_and_a_poisoned_fence_leaves_only_that_replica_out(
    cluster, capsys
):
    """The issue's storage invariants on a running cluster: SetLowWaterMark(10^6) on a replica holding 49 is taken
    (a previous-release server sets the mark before it copies a replica up: issue 44), but no longer keeps the
    replica's later sessions out (before issue 33 every later mark was refused: the partition never recovered
    again); a replica whose fence is raised above the partition's session (a read with session 10^12 and the
    cluster key) is left out of the store session and flagged, while the two healthy replicas go on committing;
    reset-fence lets it back in, and its next recovery sets the low-water mark the others have."""
    run = uuid.uuid4().hex[:6]
    append(cluster, run, 0, 50)
    expected = [payload(run, i) for i in range(50)]
    node = cluster.storage[2]
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 1) as admin:
        (state,) = admin.list_partitions()
    session = SyncSession(node.connect_string, cluster.cluster_key, 1, session_id=state.fence_session_id)
    try:
        answer = session.ask("set_low_water_mark", low_water_mark=10**6)
    finally:
        session.close()
    assert isinstance(answer, storage_pb2.SuccessResponse), answer
    append(cluster, run, 50, 10)
    expected += [payload(run, i) for i in range(50, 60)]

    poison = SyncSession(node.connect_string, cluster.cluster_key, 1, session_id=10**12)
    try:
        assert poison.ask("max_transaction_id").transaction_id >= 0
    finally:
        poison.close()
    append(cluster, run, 60, 40)  # the session fails on the poisoned member; the next one leaves it out
    expected += [payload(run, i) for i in range(60, 100)]
    check_log(cluster, expected, run)
    found = cli(cluster, capsys)("cluster", "verify")
    assert found.code == 1 and "fences sessions below 1000000000000" in found.out, found.out
    (owned,) = asyncio.run(server_partitions(cluster, cluster.servers[0].address)).partitions
    assert owned.healthy, owned
    assert f"replica {node.connect_string} left out: its fence is above" in cluster.servers[0].new_log()
    assert cli(cluster, capsys)("storage", "reset-fence", "-s", node.connect_string, "-p", "0").code == 0
    replicas_identical(cluster, expected)
    verify_passes(cluster, capsys)
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 1) as admin:
        (state,) = admin.list_partitions()
    assert 49 < state.low_water_mark <= state.max_transaction_id, state  # the next recovery brought it down
