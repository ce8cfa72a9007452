"""The Node.js conformance client (client.js: @grpc/grpc-js and @grpc/proto-loader loading protos/ at run time)
against a real LocalCluster, given one server address: discovery, client id, mounts, appends with locks, a stale
lock's LockFailure, a dense feed, data with CRCs, flushes, then a partition move it must follow. Checked from the
Python side too: every Node append is in the log exactly once, and its lock hashes equal the Python client's."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_client.locks import PartitionLocalLock, lock_key_id
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

HERE = Path(__file__).resolve().parent


def node_modules() -> None:
    """npm ci from package-lock.json when the modules are missing (scripts/bootstrap does it too)."""
    if all((HERE / "node_modules" / "@grpc" / name).is_dir() for name in ("grpc-js", "proto-loader")):
        return
    npm = shutil.which("npm")
    assert npm is not None, "npm is missing: run scripts/bootstrap (it installs Node.js)"
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=600)


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    node_modules()
    with LocalCluster(
        tmp_path_factory.mktemp("node"), storage_nodes=3, servers=1, partitions=2,
        cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string,
    ) as c:
        yield c


def read_log(address: str, partition: int) -> list[Any]:
    """Every committed record of a partition, from its owner."""
    with grpc.insecure_channel(address) as channel:
        stub = server_pb2_grpc.WaltzServerStub(channel)
        hwm = stub.GetHighWaterMark(server_pb2.HighWaterMarkRequest(partition_id=partition), timeout=10)
        if hwm.high_water_mark < 0:
            return []
        request = server_pb2.ReadTransactionsRequest(
            partition_id=partition, from_transaction_id=0, to_transaction_id=hwm.high_water_mark
        )
        return [r for response in stub.ReadTransactions(request, timeout=60) for r in response.records]


@pytest.mark.slow
def test_the_node_client_conforms(cluster: LocalCluster) -> None:
    node = shutil.which("node")
    assert node is not None, "node is missing: run scripts/bootstrap (it installs Node.js)"
    process = subprocess.Popen(
        [node, str(HERE / "client.js"), cluster.servers[0].address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[dict[str, Any]] = []
    try:
        assert process.stdout is not None
        killer = threading.Timer(300, process.kill)  # a hung client fails the test, it does not hang it
        killer.start()
        try:
            for line in process.stdout:
                lines.append(json.loads(line))
                if lines[-1].get("phase") == "steady":
                    cluster.add_server()  # the coordinator moves a partition to it
            process.wait(timeout=30)
        finally:
            killer.cancel()
        assert process.returncode == 0, (lines, process.stderr.read() if process.stderr else "")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    steady, done = lines
    client_id = steady["client_id"]

    assert steady["appended"] == 1000 and steady["fetched"] >= 10
    assert steady["inline"]["0"] >= 400 and steady["inline"]["1"] == 0  # asked for on partition 0 only (issue 31)
    for pid in ("0", "1"):
        assert steady["locks"][pid]["conflict"] >= steady["locks"][pid]["held"]  # the stale lock failed
        assert steady["flushed"][pid] >= steady["dense"][pid] - 1
    assert steady["limits"]["max_transaction_bytes"] == 1048576
    # docs/protocol.md as the server answers it (issue 28): a Feed or Flush of a partition that does not exist is
    # answered MountResponse NO_SUCH_PARTITION, and the Flush gets no FlushResponse; reads above the log
    edges = steady["edges"]
    assert edges["feed"] == edges["flush"] == "NO_SUCH_PARTITION" and edges["flush_responses"] == 0, edges
    assert "partition 2 does not exist" in edges["message"]
    assert edges["read_past"] == "NOT_FOUND"
    assert edges["data_past"]["success"] is False and "does not exist" in edges["data_past"]["error_message"]
    vectors = steady["lock_hashes"]
    assert len(vectors) >= 10
    for v in vectors:  # Node, the spec and the Python client agree
        assert v["node"] == v["spec"] == PartitionLocalLock(v["name"], int(v["id"])).lock_hash, v
    key_ids = steady["lock_key_ids"]  # docs/protocol.md's lock keys: Node, the doc and the Python client agree
    assert len(key_ids) >= 6 and any(not v["key"].isascii() for v in key_ids)
    for v in key_ids:
        assert int(v["node"]) == int(v["spec"]) == lock_key_id(v["key"]), v

    assert done["heard"]["state"] == "NOT_READY"  # learnt on its stream
    assert done["new_owner"] == cluster.servers[1].address and done["new_generation"] > done["old_generation"]
    owners = {p.partition_id: p.address for p in _cluster_info(cluster.servers[0].address).partitions}
    data: list[bytes] = []
    for pid in (0, 1):
        records = read_log(owners[pid], pid)
        assert [r.transaction_id for r in records] == list(range(len(records)))
        data += [r.data for r in records if r.req_id.client_id == client_id]
    expected = [b"node-%d-%d" % (p, i) for p in (0, 1) for i in range(500)]
    expected += [b"after-%d-%d" % (p, i) for p in (0, 1) for i in range(100)]
    expected += [b"lock-winner-%d" % p for p in (0, 1)]
    assert sorted(data) == sorted(expected)  # each exactly once: nothing lost, the re-send not doubled


def _cluster_info(address: str) -> server_pb2.ClusterInfoResponse:
    deadline = time.monotonic() + 10
    while True:
        try:
            with grpc.insecure_channel(address) as channel:
                stub = server_pb2_grpc.WaltzServerStub(channel)
                return stub.GetClusterInfo(server_pb2.ClusterInfoRequest(), timeout=5)
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
