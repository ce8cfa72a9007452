"""Kazoo against the real ZooKeeper the fixtures start: the operations Waltz's metadata relies on."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.protocol.states import KazooState

from waltz.v1 import metadata_pb2
from waltz_common import zk as zkmeta
from waltz_common.testing.fault_proxy import FaultProxy
from waltz_common.testing.zookeeper import ZooKeeperProcess, pid_alive


def test_create_and_read_a_protobuf_payload(zk, cluster_root):
    paths = zkmeta.ZkPaths(cluster_root)
    zkmeta.create(zk, paths.store, metadata_pb2.StoreParams(cluster_key="k", num_partitions=4))
    params, stat = zkmeta.require(zk, paths.store, metadata_pb2.StoreParams)
    assert (params.cluster_key, params.num_partitions, stat.version) == ("k", 4, 0)
    assert zkmeta.read(zk, paths.group_descriptor, metadata_pb2.GroupDescriptor) is None


def test_compare_and_set_by_version(zk, cluster_root):
    path = zkmeta.ZkPaths(cluster_root).partition_metadata(0)
    zkmeta.create(zk, path, metadata_pb2.PartitionMetadata(generation=1, session_id=0))
    _, stat = zkmeta.require(zk, path, metadata_pb2.PartitionMetadata)
    zkmeta.write(zk, path, metadata_pb2.PartitionMetadata(generation=1, session_id=1), version=stat.version)
    with pytest.raises(BadVersionError):  # a second writer holding the old version loses
        zkmeta.write(zk, path, metadata_pb2.PartitionMetadata(generation=1, session_id=1), version=stat.version)

    def bump(m: metadata_pb2.PartitionMetadata) -> metadata_pb2.PartitionMetadata:
        return metadata_pb2.PartitionMetadata(generation=m.generation, session_id=m.session_id + 1)

    bumped = zkmeta.update(zk, path, metadata_pb2.PartitionMetadata, bump)
    assert bumped.session_id == 2
    assert zkmeta.require(zk, path, metadata_pb2.PartitionMetadata)[0].session_id == 2


def test_multi_op_transaction_is_all_or_nothing(zk, cluster_root):
    zk.ensure_path(cluster_root)
    zk.create(f"{cluster_root}/a", b"1")
    _, stat = zk.get(f"{cluster_root}/a")
    failing = zk.transaction()
    failing.check(f"{cluster_root}/a", version=stat.version + 1)  # wrong version: the whole thing fails
    failing.create(f"{cluster_root}/b", b"2")
    results = failing.commit()
    assert any(isinstance(r, Exception) for r in results)
    assert zk.exists(f"{cluster_root}/b") is None
    passing = zk.transaction()
    passing.check(f"{cluster_root}/a", version=stat.version)
    passing.create(f"{cluster_root}/b", b"2")
    passing.set_data(f"{cluster_root}/a", b"3")
    assert not any(isinstance(r, Exception) for r in passing.commit())
    assert zk.get(f"{cluster_root}/a")[0] == b"3" and zk.get(f"{cluster_root}/b")[0] == b"2"


def test_ephemeral_node_disappears_with_its_session(zookeeper, zk, cluster_root):
    other = zkmeta.connect(zookeeper.connect_string)
    path = zkmeta.ZkPaths(cluster_root).server(7)
    zkmeta.create(other, path, metadata_pb2.ServerDescriptor(server_id=7, host="127.0.0.1", port=1), ephemeral=True)
    assert zk.exists(path).ephemeralOwner == other.client_id[0]
    other.stop()
    other.close()
    with pytest.raises(NoNodeError):
        zk.get(path)


def test_unreachable_zookeeper_is_one_clear_error():
    with pytest.raises(zkmeta.MetadataError, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:1 "):
        zkmeta.connect("127.0.0.1:1", timeout_s=1.0)


def test_scripts_leave_no_process_behind(tmp_path):
    process = ZooKeeperProcess(tmp_path / "zk")
    with process:
        pid = process.pid
        assert pid is not None and pid_alive(pid)
        client = zkmeta.connect(process.connect_string)
        assert client.server_version()[0] == 3
        client.stop()
        client.close()
    assert not pid_alive(pid)
    assert process.pid is None


def srvr(port: int) -> str:
    """ZooKeeper's answer to the `srvr` four-letter word."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"srvr")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer.decode()


def test_a_started_zookeeper_serves_even_when_it_loads_a_large_log_first(tmp_path):
    """ZooKeeper answers `ruok` as soon as its port is open, before it has loaded its data and serves
    sessions; zookeeper-start used to return on that imok, and a client connecting next could time out
    (a loaded CI machine: 'cannot reach ZooKeeper ... within 10 s'). A 40 MB log makes the gap wide."""
    process = ZooKeeperProcess(tmp_path / "zookeeper")
    process.start()
    try:
        client = zkmeta.connect(process.connect_string)
        try:
            payload = b"x" * 500_000
            client.ensure_path("/load")
            for batch in range(8):
                waits = [client.create_async(f"/load/n{batch}-{i}", payload) for i in range(10)]
                for wait in waits:
                    wait.get(timeout=60)
        finally:
            client.stop()
            client.close()
        process.kill()
        process.start()
        assert process.port is not None
        assert "Mode: standalone" in srvr(process.port)
    finally:
        process.stop()


def until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s"
        time.sleep(0.02)


def test_a_client_whose_reconnect_is_never_answered_tries_again_before_its_session_expires(zookeeper):
    """A ZooKeeper 3.8 that is starting may accept a connection and never answer it; kazoo waited for the
    answer to its connect request for the whole session timeout (30 s with one host), so a server that
    reconnected at that moment lost its session and every partition it owned (CI, the kill -9 of ZooKeeper
    within the session timeout: 'generations moved'). Now it gives up on that connection after
    CONNECT_ANSWER_TIMEOUT_S and reconnects to its session."""
    with FaultProxy(zookeeper.connect_string) as proxy:
        client = zkmeta.connect(proxy.address, session_timeout_s=30.0)
        try:
            session = client.client_id
            states: list[KazooState] = []
            client.add_listener(states.append)
            proxy.cut()  # the connection drops ...
            until(lambda: KazooState.SUSPENDED in states, 10)
            made = proxy.connections_made
            proxy.swallow_next(1)  # ... and the first new one kazoo makes is accepted and never answered
            proxy.heal()
            until(lambda: proxy.connections_made > made, 10)
            # a bounded wait for the answer, then a retry: well inside the 30 s session (before: 30 s, expired)
            until(lambda: client.state == KazooState.CONNECTED, 12)
            assert states[-1] == KazooState.CONNECTED, states
            assert client.client_id == session
            assert client.exists("/") is not None
        finally:
            client.stop()
            client.close()
