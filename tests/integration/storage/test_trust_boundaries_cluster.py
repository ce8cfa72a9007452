"""Issue 25 on a whole plaintext cluster (ZooKeeper, 3 storage nodes, a server): what a caller with the cluster
key tried from outside, and what `waltz cluster verify` says about the damage it could do before.

The tests share one cluster and run in order; each leaves it healthy (verify PASSED) for the next.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks
from tests.integration.cli.test_cli_cluster import until
from tests.integration.storage.test_storage_process import SyncSession
from tests.unit.cli.helpers import Run, waltz
from waltz.v1 import storage_pb2
from waltz_cli.errors import CliError
from waltz_cli.storage_session import StorageSession
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import Record, ReqId, crc32
from waltz_storage.admin_client import PartitionState, StorageAdminClient
from waltz_storage.storage_manager import StorageManager

HUGE = 10**12
FAST = {"client.longWaitThreshold": 500, "client.mountTimeout": 60, "client.requestTimeout": 60}


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("trust"),
        storage_nodes=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        cluster_root=f"/test/{uuid.uuid4().hex[:12]}",
    ) as running:
        yield running


def cli(cluster: LocalCluster, capsys) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        return waltz(capsys, "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--timeout", "5", *argv)

    return run


def append(cluster: LocalCluster, n: int) -> int:
    """Commit n transactions; the partition's high-water mark afterwards."""

    async def main() -> int:
        async with AsyncWaltzClient(MemoryCallbacks(), {**cluster.client_config(), **FAST}) as client:
            await client.wait_mounted()
            futures = [await client.submit(Ctx(b"t%d" % i)) for i in range(n)]
            assert all(await asyncio.gather(*futures))
            return int(await client.high_water_mark(0))

    return asyncio.run(asyncio.wait_for(main(), 180))


def admin(cluster: LocalCluster, index: int) -> StorageAdminClient:
    return StorageAdminClient("127.0.0.1", cluster.storage[index].admin_port, cluster.cluster_key, 1)


def state(cluster: LocalCluster, index: int) -> PartitionState:
    with admin(cluster, index) as a:
        (found,) = a.list_partitions()
    return found


def verified(cluster: LocalCluster, capsys) -> Run:
    run = until(lambda: cli(cluster, capsys)("cluster", "verify"))
    assert run.code == 0, run.out + run.err
    return run


def test_truncating_committed_transactions_is_refused_and_a_restart_keeps_them(cluster, capsys):
    """Finding: truncate to 100 plus SetLowWaterMark(session + 1, 100) on 2 of 3 replicas, then a server
    restart: 803 committed transactions gone, also from the healthy replica."""
    hwm = append(cluster, 903)
    assert hwm >= 902
    for index in (0, 1):
        session = state(cluster, index).fence_session_id + 1
        with StorageSession(cluster.storage[index].connect_string, cluster.cluster_key, 1, 10, offline=False) as s:
            with pytest.raises(CliError, match="are committed"):
                s.truncate(0, session, 100)
            with pytest.raises(CliError, match=r"truncate|committed"):
                s.set_low_water_mark(0, session, 100)
    cluster.servers[0].stop()
    cluster.servers[0].start()
    verified(cluster, capsys)
    assert append(cluster, 1) == hwm + 1
    for index in range(3):
        assert state(cluster, index).max_transaction_id == hwm + 1


def session(cluster: LocalCluster, index: int, session_id: int, framed: bool) -> SyncSession:
    """A Session stream to a storage node with the cluster key: over gRPC, or over its framed session port."""
    node = cluster.storage[index]
    address = f"127.0.0.1:{node.session_port}" if framed else node.connect_string
    return SyncSession(address, cluster.cluster_key, 1, session_id=session_id, framed=framed)


@pytest.mark.parametrize("framed", [False, True], ids=["grpc", "framed"])
def test_a_read_with_a_huge_session_without_tls_is_a_poisoned_fence_that_verify_names_and_reset_fence_clears(
    cluster, capsys, framed
):
    """Finding: a MaxTransactionId read with session 10^12 raised the fence; the partition looped on
    STALE_SESSION for good. Without TLS the cluster key's holder is trusted as a server, and a server's read of a
    newer session must raise the fence (a new owner's first read shuts the old owner out: docs/security.md), so
    it still does; under TLS an operator's cannot (tests/component/storage/test_trust_boundaries.py). What no
    longer holds is "for good": verify names it and reset-fence clears it."""
    node = cluster.storage[1]
    probe = session(cluster, 1, HUGE, framed)
    try:
        assert probe.ask("max_transaction_id").transaction_id >= -1
    finally:
        probe.close()
    assert state(cluster, 1).fence_session_id == HUGE
    run = cli(cluster, capsys)
    failed = run("cluster", "verify")
    assert failed.code == 1 and f"fences sessions below {HUGE}" in failed.out, failed.out
    assert run("storage", "reset-fence", "-s", node.connect_string, "-p", "0").code == 0
    verified(cluster, capsys)
    before = state(cluster, 0).max_transaction_id
    assert append(cluster, 5) == before + 5


@pytest.mark.parametrize("framed", [False, True], ids=["grpc", "framed"])
def test_reset_fence_clears_a_poisoned_fence(cluster, capsys, framed):
    """Finding: SetLowWaterMark with session 10^12 poisoned a replica, and no command reset it."""
    node = cluster.storage[2]
    top = state(cluster, 2).max_transaction_id
    poison = session(cluster, 2, HUGE, framed)
    try:
        answer = poison.ask("set_low_water_mark", low_water_mark=top)
        assert not hasattr(answer, "exception"), answer
    finally:
        poison.close()
    assert state(cluster, 2).fence_session_id == HUGE
    run = cli(cluster, capsys)
    failed = run("cluster", "verify")
    assert failed.code == 1 and f"fences sessions below {HUGE}" in failed.out, failed.out
    reset = run("storage", "reset-fence", "-s", node.connect_string, "-p", "0", "--json")
    assert reset.code == 0, reset.err
    (done,) = reset.json()["partitions"]
    assert done["fence_was"] == HUGE and done["fence"] < HUGE
    assert run("storage", "reset-fence", "-s", node.connect_string, "-p", "0").code == 1  # nothing left to clear
    verified(cluster, capsys)
    assert state(cluster, 2).fence_session_id < HUGE
    top = state(cluster, 0).max_transaction_id
    assert append(cluster, 3) == top + 3


def test_verify_names_a_forged_tail_and_different_records(cluster, capsys):
    """Finding: `waltz cluster verify` said PASSED over replicas at different max ids and different records
    at one id. Without TLS a caller with the cluster key is trusted as a server and can still forge a record
    (docs/security.md): verify must show it."""
    run = cli(cluster, capsys)
    hwm = append(cluster, 10)
    verified(cluster, capsys)
    fence = state(cluster, 1).fence_session_id
    forged = Record(hwm + 1, ReqId(99, 1, 0, 1), 0, b"forged", crc32(b"forged"))
    with StorageSession(cluster.storage[1].connect_string, cluster.cluster_key, 1, 10, offline=False) as s:
        s.append(0, fence, [forged])
    found = run("cluster", "verify")
    assert found.code == 1, found.out
    assert f"replica {cluster.storage[1].connect_string} holds up to {hwm + 1}, above the high-water mark" in found.out
    assert "replicas at different max transaction ids" in found.out

    # A record rewritten in place on one node's disk, checksums and all.
    cluster.servers[0].stop()  # its next session's recovery would truncate the forged tail: keep both for now
    victim = cluster.storage[2]
    victim.stop()
    with StorageManager(victim.directory, uuid.UUID(cluster.cluster_key), 1) as manager:
        partition = manager.partition(0)
        at = hwm - 3
        kept = partition.records(at + 1, hwm - at)
        partition.truncate(at - 1)
        partition.append([Record(at, ReqId(98, 1, 0, 1), 0, b"other", crc32(b"other")), *kept])
    victim.start()
    cluster.servers[0].start()
    found = until(lambda: _differs(run, at))
    assert f"replicas hold different records at transaction {at}" in found.out, found.out


def frame_answer(port: int, request: storage_pb2.StorageRequest) -> storage_pb2.StorageResponse:
    """The answer of a storage node's framed session port to one request on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        data = request.SerializeToString()
        sock.sendall(len(data).to_bytes(4, "big") + data)
        stream = sock.makefile("rb")
        return storage_pb2.StorageResponse.FromString(stream.read(int.from_bytes(stream.read(4), "big")))


def _differs(run: Callable[..., Run], at: int) -> Run:
    """verify, as a Run whose code is 0 once it names the different records at `at` (the cluster settles)."""
    found = run("cluster", "verify")
    return Run(0 if f"different records at transaction {at}" in found.out else 1, found.out, found.err)


def test_the_cluster_key_is_in_no_message_and_no_log(cluster):
    """Finding: without TLS the Open error printed the real cluster key, and the storage log wrote it."""
    other = str(uuid.uuid4())
    with pytest.raises(CliError) as refused:
        StorageSession(cluster.storage[0].connect_string, other, 1, 10, offline=False)
    assert "CLUSTER_KEY_MISMATCH" in str(refused.value) or "cluster key" in str(refused.value)
    assert cluster.cluster_key not in str(refused.value) and other not in str(refused.value)
    framed = frame_answer(cluster.storage[0].session_port, storage_pb2.StorageRequest(open=storage_pb2.OpenRequest(
        session_id=-1, seq_num=-1, partition_id=-1, cluster_key=other, num_partitions=1)))
    assert framed.failure.exception.code == storage_pb2.StorageRpcException.CLUSTER_KEY_MISMATCH
    assert cluster.cluster_key not in str(framed) and other not in str(framed)
    for node in cluster.storage:
        log = node.log_path.read_text()
        assert cluster.cluster_key not in log and other not in log
