"""`waltz-storage` as a real process with a real ZooKeeper: start, serve, SIGTERM, kill -9, exclusivity."""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from waltz.v1 import common_pb2, storage_pb2, storage_pb2_grpc
from waltz_common import cluster_admin
from waltz_common.testing.local_cluster import LocalCluster, ManagedProcess, free_port
from waltz_common.types import crc32
from waltz_common.zk import ZkPaths
from waltz_storage.admin_client import StorageAdminClient

_END = object()


def make_record(txn: int) -> common_pb2.Record:
    data = bytes((txn * 13 + i) % 256 for i in range(20 + txn % 300))
    return common_pb2.Record(
        transaction_id=txn,
        req_id=common_pb2.ReqId(client_id=3, generation=1, partition_id=0, seq_num=txn),
        header=txn % 7,
        data_length=len(data),
        data=data,
        checksum=crc32(data),
    )


class SyncSession:
    """A blocking Session stream: send requests, receive answers with a timeout. framed: over the node's framed
    session port (address is then host:storage.sessionPort), plaintext."""

    def __init__(
        self, address: str, cluster_key: str, num_partitions: int, session_id: int = 1, framed: bool = False
    ) -> None:
        self.session_id = session_id
        self._out: queue.Queue[Any] = queue.Queue()
        self._in: queue.Queue[Any] = queue.Queue()
        self._socket: socket.socket | None = None
        if framed:
            host, _, port = address.rpartition(":")
            self._socket = socket.create_connection((host, int(port)), timeout=60)
            self._reader = threading.Thread(target=self._read_frames, daemon=True)
        else:
            self.channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
            self._call = storage_pb2_grpc.WaltzStorageStub(self.channel).Session(iter(self._out.get, _END))
            self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._seq = 0
        open_request = storage_pb2.OpenRequest(
            session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key, num_partitions=num_partitions
        )
        self._put(storage_pb2.StorageRequest(open=open_request))
        assert self.recv().WhichOneof("response") == "success"

    def _put(self, request: storage_pb2.StorageRequest) -> None:
        if self._socket is None:
            self._out.put(request)
            return
        data = request.SerializeToString()
        self._socket.sendall(len(data).to_bytes(4, "big") + data)

    def _read(self) -> None:
        try:
            for response in self._call:
                self._in.put(response)
        except grpc.RpcError as e:
            self._in.put(e)

    def _read_frames(self) -> None:
        assert self._socket is not None
        stream = self._socket.makefile("rb")
        try:
            while len(header := stream.read(4)) == 4:
                self._in.put(storage_pb2.StorageResponse.FromString(stream.read(int.from_bytes(header, "big"))))
            self._in.put(ConnectionError("the node closed the connection"))
        except OSError as e:
            self._in.put(e)

    def send(self, kind: str, **fields: Any) -> int:
        self._seq += 1
        fields.setdefault("session_id", self.session_id)
        fields.setdefault("partition_id", 0)
        cls = type(getattr(storage_pb2.StorageRequest(), kind))
        self._put(storage_pb2.StorageRequest(**{kind: cls(seq_num=self._seq, **fields)}))
        return self._seq

    def recv(self, timeout: float = 60) -> storage_pb2.StorageResponse:
        response = self._in.get(timeout=timeout)
        if isinstance(response, Exception):
            raise response
        return response

    def ask(self, kind: str, **fields: Any) -> Any:
        self.send(kind, **fields)
        response = self.recv()
        return getattr(response, response.WhichOneof("response"))

    def read_all(self, partition_id: int = 0) -> list[common_pb2.Record]:
        found: list[common_pb2.Record] = []
        while True:
            got = self.ask("record_list", partition_id=partition_id, transaction_id=len(found), max_records=500)
            found.extend(got.records)
            if got.record_list_length == 0:
                return found

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            return
        self._out.put(_END)
        self._call.cancel()
        self.channel.close()


@pytest.fixture
def cluster(tmp_path, zookeeper, cluster_root) -> Iterator[LocalCluster]:
    """One storage node (no servers) of a 2-partition cluster, both partitions assigned to it."""
    local = LocalCluster(
        tmp_path / "cluster",
        storage_nodes=1,
        servers=0,
        partitions=2,
        zookeeper=zookeeper.connect_string,
        cluster_root=cluster_root,
        storage_overrides={"storage.segment.size.threshold": 20_000, "storage.shutdownGraceSeconds": 600},
    )
    with local:
        yield local


def extra_node(cluster: LocalCluster, name: str, **settings: Any) -> ManagedProcess:
    """Another storage process configured like the cluster's first node, with its own ports and log."""
    workdir = cluster.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(cluster.storage[0].config_path.read_text())
    config.update({"storage.port": free_port(), "storage.admin.port": free_port(), "storage.metrics.port": 0})
    if config.get("storage.sessionPort"):
        config["storage.sessionPort"] = free_port()
    config.update(settings)
    (workdir / "storage.yaml").write_text(yaml.safe_dump(config))
    return ManagedProcess(
        name,
        [sys.executable, "-m", "waltz_storage.main"],
        workdir / "storage.yaml",
        workdir / "storage.log",
        "waltz-storage ready",
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
        return page.read().decode()


def run_to_exit(process: ManagedProcess, timeout: float = 60) -> tuple[int, str]:
    """Start a process expected to refuse to start; its exit status and output."""
    with pytest.raises(RuntimeError, match="exited with"):
        process.start(timeout)
    assert process.process is not None
    return process.process.returncode, process.new_log()


def test_starts_serves_and_exits_zero_on_sigterm(cluster):
    node = cluster.storage[0]
    with grpc.insecure_channel(node.connect_string) as channel:
        # ready once the partitions ZooKeeper assigns it are held here: LocalCluster creates them after the start
        deadline = time.monotonic() + 30
        check = health_pb2_grpc.HealthStub(channel).Check
        while (health := check(health_pb2.HealthCheckRequest(service=""), timeout=30)).status != \
                health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, f"not ready within 30 s: {health}"
            time.sleep(0.1)
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        services = {s.name for s in next(reflection).list_services_response.service}
        assert "waltz.v1.WaltzStorage" in services
    session = SyncSession(node.connect_string, cluster.cluster_key, 2)
    idle = StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 2)
    try:
        answer = session.ask("append", partition_id=1, records=[make_record(0)], record_list_length=1)
        assert answer.seq_num == 1 and answer.partition_id == 1
        metrics = scrape(node.metrics_port)
        # Open, idle streams end when the node stops: it does not sit out the (long) grace period.
        assert node.stop(timeout=60) == 0
    finally:
        session.close()
        idle.close()
    assert "waltz_storage_appended_records_total 1.0" in metrics
    assert 'waltz_storage_partition_max_transaction_id{partition="1"} 0.0' in metrics
    assert "waltz_storage_fsync_duration_seconds_bucket" in metrics
    log = node.new_log()
    assert "waltz-storage ready 127.0.0.1:" in log and "shutting down" in log and "Traceback" not in log


def test_kill9_during_appends_loses_no_acknowledged_record(cluster):
    node = cluster.storage[0]
    session = SyncSession(node.connect_string, cluster.cluster_key, 2)
    batch, acked, sent, outstanding = 7, -1, 0, {}
    try:
        while True:
            while len(outstanding) < 8:
                recs = [make_record(t) for t in range(sent, sent + batch)]
                outstanding[session.send("append", records=recs, record_list_length=batch)] = sent + batch - 1
                sent += batch
            response = session.recv()
            assert response.WhichOneof("response") == "success", response
            acked = max(acked, outstanding.pop(response.success.seq_num))
            if acked >= 600:
                node.kill()  # appends are still in flight
                break
    finally:
        session.close()
    node.start()
    session = SyncSession(node.connect_string, cluster.cluster_key, 2)
    try:
        found = session.read_all()
        assert len(found) - 1 >= acked
        assert found == [make_record(t) for t in range(len(found))]
        assert session.ask("max_transaction_id").transaction_id == len(found) - 1
    finally:
        session.close()
    assert len(list(node.directory.joinpath("0").glob("*.seg"))) > 1  # the test crossed segment rolls


def test_a_second_node_on_the_same_directory_refuses_to_start(cluster):
    second = extra_node(cluster, "second")
    try:
        status, log = run_to_exit(second)
    finally:
        second.kill()
    assert status == 1 and "is already in use" in log
    with StorageAdminClient("127.0.0.1", cluster.storage[0].admin_port, cluster.cluster_key, 2) as admin:
        assert [p.partition_id for p in admin.list_partitions()] == [0, 1]


def test_refuses_a_missing_cluster_and_a_disagreeing_control_file(cluster, zk, cluster_root):
    missing = extra_node(cluster, "missing", **{"cluster.root": cluster_root + "-missing"})
    try:
        status, log = run_to_exit(missing)
    finally:
        missing.kill()
    assert status == 1 and "has the cluster been created?" in log
    other_root = cluster_root + "-other"
    other_key = cluster_admin.create_cluster(zk, ZkPaths(other_root), "other", 2)
    assert cluster.storage[0].stop() == 0
    other = extra_node(cluster, "other", **{"cluster.root": other_root})
    try:
        status, log = run_to_exit(other)
    finally:
        other.kill()
    assert status == 1 and "belongs to another cluster" in log
    assert other_key not in log and cluster.cluster_key not in log  # issue 25: the key is in no log line
    assert "Traceback" not in log


def test_a_bad_configuration_exits_2_like_the_server(tmp_path):
    config = {"zookeeper.connectString": "127.0.0.1:1", "cluster.root": "/x", "storage.directory": str(tmp_path)}
    for values, message in (
        ({"storage.port": 99999, "storage.admin.port": 1}, "storage.port: 99999 is out of range (0..65535)"),
        ({"storage.port": 1, "storage.admin.port": 2, "storage.metrics.port": True}, "True is a boolean"),
        ({"storage.port": 1, "storage.admin.port": 2, "bogus": 1}, "unknown configuration key(s): bogus"),
    ):
        (tmp_path / "storage.yaml").write_text(yaml.safe_dump({**config, **values}))
        done = subprocess.run(
            [sys.executable, "-m", "waltz_storage.main", str(tmp_path / "storage.yaml")],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_taken_port_is_one_line_not_a_traceback(cluster, tmp_path):
    node = cluster.storage[0]
    for role, values in (
        ("", {"storage.port": node.port}),
        (" (admin port)", {"storage.admin.port": node.admin_port}),
        (" (metrics port)", {"storage.metrics.port": node.metrics_port}),
        (" (session port)", {"storage.sessionPort": node.session_port}),
    ):
        taken = next(iter(values.values()))
        other = extra_node(cluster, f"taken{taken}", **{"storage.directory": str(tmp_path / str(taken)), **values})
        try:
            status, log = run_to_exit(other)
        finally:
            other.kill()
        assert status == 1 and "Traceback" not in log, log
        assert f"waltz-storage: cannot listen on 127.0.0.1:{taken}{role}: address in use" in log.splitlines(), log
