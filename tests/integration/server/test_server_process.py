"""`waltz-server CONFIG` as a process: ready line, health, admin query, SIGTERM deregisters and exits 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import cluster_admin
from waltz_common.testing.local_cluster import free_port
from waltz_common.zk import ZkPaths

BIN = Path(sys.executable).parent


def wait_for_line(process: subprocess.Popen, log: Path, marker: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        for line in log.read_text().splitlines():
            if marker in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {marker!r} from waltz-server:\n{log.read_text()[-3000:]}")


def start_server(tmp_path: Path, config: dict) -> tuple[subprocess.Popen, Path]:
    """`waltz-server` on CONFIG written to tmp_path, its stderr going to the log file it returns."""
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(BIN / "waltz-server"), str(tmp_path / "server.yaml")], stderr=out)
    return process, log


def test_server_process_serves_and_stops_cleanly(zookeeper, zk, cluster_root, tmp_path):
    paths = ZkPaths(cluster_root)
    cluster_admin.create_cluster(zk, paths, "test", 2)
    port = free_port()
    config = {
        "zookeeper.connectString": zookeeper.connect_string,
        "zookeeper.sessionTimeoutSeconds": 10.0,
        "cluster.root": cluster_root,
        "server.port": port,
        "server.shutdownGraceSeconds": 1,
    }
    process, log = start_server(tmp_path, config)
    try:
        ready = wait_for_line(process, log, "waltz-server ready")
        assert f"127.0.0.1:{port} id=" in ready
        server_id = int(ready.rsplit("id=", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            stub = server_pb2_grpc.WaltzServerStub(channel)
            deadline = time.monotonic() + 30
            while True:
                answer = stub.GetServerPartitions(server_pb2.ServerPartitionsRequest(), timeout=10)
                if len(answer.partitions) == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert answer.server_id == server_id
            assert [(p.partition_id, p.generation) for p in answer.partitions] == [(0, 1), (1, 1)]
            assert not any(p.healthy for p in answer.partitions)  # no storage nodes: no store session
            assert all(p.detail for p in answer.partitions)
        assert zk.exists(paths.server(server_id)) is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert zk.exists(paths.server(server_id)) is None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_sigterm_ends_open_client_streams_rather_than_waiting_out_the_grace(zookeeper, zk, cluster_root, tmp_path):
    """A client keeps its stream open for as long as the server is up; SIGTERM used to wait out the whole
    shutdownGraceSeconds for it (10 s by default: a rolling restart paid it on every server)."""
    cluster_admin.create_cluster(zk, ZkPaths(cluster_root), "test", 1)
    port = free_port()
    config = {
        "zookeeper.connectString": zookeeper.connect_string,
        "cluster.root": cluster_root,
        "server.port": port,
        "server.shutdownGraceSeconds": 300,
    }
    process, log = start_server(tmp_path, config)
    release = threading.Event()

    def nothing_until_released() -> Iterator[server_pb2.ClientMessage]:
        release.wait(120)
        return
        yield

    try:
        wait_for_line(process, log, "waltz-server ready")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = server_pb2_grpc.WaltzServerStub(channel).Stream(nothing_until_released(), timeout=120)
            time.sleep(1)  # the stream is open at the server
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
            with pytest.raises(grpc.RpcError) as ended:
                list(stream)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
            assert "shutting down" in str(ended.value.details())
    finally:
        release.set()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_bad_configuration_exits_with_a_message(tmp_path):
    (tmp_path / "server.yaml").write_text(yaml.safe_dump({"cluster.root": "/x", "server.port": 1}))
    result = subprocess.run(
        [str(BIN / "waltz-server"), str(tmp_path / "server.yaml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "zookeeper.connectString" in result.stderr


def run_server(tmp_path: Path, config: dict) -> subprocess.CompletedProcess[str]:
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run(
        [str(BIN / "waltz-server"), str(tmp_path / "server.yaml")], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"server.port": 99999}, "server.port: 99999 is out of range (1..65535)"),
        ({"server.port": 55280, "server.metrics.port": 70000}, "server.metrics.port: 70000 is out of range"),
        ({"server.port": 55280.0}, "server.port: 55280.0 is not an integer"),
        ({"server.port": 55280, "server.host": "0.0.0.0"}, "set server.advertisedAddress"),
    ],
)
def test_a_value_out_of_range_exits_2_with_one_line(tmp_path, values, message):
    result = run_server(tmp_path, {"zookeeper.connectString": "127.0.0.1:1", "cluster.root": "/x", **values})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_taken_port_is_one_line_not_a_traceback(zookeeper, zk, cluster_root, tmp_path):
    cluster_admin.create_cluster(zk, ZkPaths(cluster_root), "test", 1)
    base = {"zookeeper.connectString": zookeeper.connect_string, "cluster.root": cluster_root}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for values, line in (
            ({"server.port": port}, f"waltz-server: cannot listen on 127.0.0.1:{port}: address in use"),
            (
                {"server.port": free_port(), "server.metrics.port": port},
                f"waltz-server: cannot listen on 127.0.0.1:{port} (metrics port): address in use",
            ),
        ):
            result = run_server(tmp_path, {**base, **values})
            assert result.returncode == 1, result.stderr
            assert "Traceback" not in result.stderr
            assert result.stderr.strip().splitlines()[-1] == line, result.stderr
