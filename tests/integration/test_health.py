"""Health that tells the truth, on real processes: a server's partitions are NOT_SERVING (and say why) while two
of three storage nodes are down and SERVING again once they are back, while its readiness holds; storage nodes
report each partition; the plaintext health ports answer probes on a mutual TLS cluster."""

from __future__ import annotations

import re
import time

import grpc

from tests.integration.health_probe import status, wait_for
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_common.health import INTERVAL_S
from waltz_common.testing.local_cluster import LocalCluster
from waltz_server import health as server_health
from waltz_storage import health as storage_health

PARTITIONS = 2
# Reconnects to a restarted storage node retry at most 1 s apart.
SERVER_OVERRIDES = {"storage.maxRetryInterval": 1000}


def server_partitions(address: str) -> server_pb2.ServerPartitionsResponse:
    with grpc.insecure_channel(address) as channel:
        return server_pb2_grpc.WaltzServerStub(channel).GetServerPartitions(
            server_pb2.ServerPartitionsRequest(), timeout=10
        )


def test_partitions_without_a_quorum_are_not_serving_with_a_reason_and_serve_again(tmp_path):
    with LocalCluster(
        tmp_path, storage_nodes=3, servers=1, partitions=PARTITIONS, health_ports=True,
        server_overrides=SERVER_OVERRIDES,
    ) as cluster:
        server = cluster.servers[0]
        probe = f"127.0.0.1:{server.health_port}"
        names = [server_health.partition_name(p) for p in range(PARTITIONS)]
        for name in names:  # owned and recovered
            wait_for(server.address, name, "SERVING")
        for name in ("", server_health.SERVICE, server_health.PARTITIONS, server_health.LIVE, *names):
            assert status(server.address, name) == "SERVING", name
            assert status(probe, name) == "SERVING", name
        assert status(server.address, server_health.partition_name(PARTITIONS)) == "NOT_FOUND"  # not owned

        for node in cluster.storage[1:]:
            node.kill()
        took = wait_for(server.address, server_health.PARTITIONS, "NOT_SERVING")
        for name in names:
            wait_for(probe, name, "NOT_SERVING", timeout=30)
        # It is still connected to ZooKeeper and alive: readiness and liveness hold.
        for name in ("", server_health.SERVICE, server_health.LIVE):
            assert status(probe, name) == "SERVING", name
        reported = server_partitions(server.address).partitions
        assert [p.partition_id for p in reported] == list(range(PARTITIONS))
        assert all(not p.healthy and p.detail for p in reported), reported
        log = server.new_log()
        for name in names:
            assert re.search(rf"health '{re.escape(name)}': NOT_SERVING: \S", log), log[-3000:]

        for node in cluster.storage[1:]:
            node.start()
        back = wait_for(server.address, server_health.PARTITIONS, "SERVING", timeout=90)
        for name in names:
            assert status(probe, name) == "SERVING", name
        assert all(p.healthy for p in server_partitions(server.address).partitions)
        print(f"[health] partitions NOT_SERVING {took:.1f} s after two storage nodes died ({reported[0].detail}), "
              f"SERVING {back:.1f} s after they restarted")


def test_storage_nodes_report_every_assigned_partition_on_every_port(tmp_path):
    with LocalCluster(tmp_path, storage_nodes=1, servers=0, partitions=3, health_ports=True) as cluster:
        node = cluster.storage[0]
        for port in (node.port, node.admin_port, node.health_port):
            address = f"127.0.0.1:{port}"
            wait_for(address, "", "SERVING", timeout=10)
            for name in (storage_health.SERVICE, storage_health.ADMIN_SERVICE, storage_health.LIVE):
                assert status(address, name) == "SERVING", (port, name)
            for pid in range(3):  # assigned after the node started: reported within a second
                wait_for(address, storage_health.partition_name(pid), "SERVING", timeout=5)
            assert status(address, storage_health.partition_name(3)) == "NOT_FOUND"


def test_the_plaintext_health_ports_answer_probes_on_a_mutual_tls_cluster(tmp_path):
    with LocalCluster(tmp_path, storage_nodes=1, servers=1, partitions=1, tls=True, health_ports=True) as cluster:
        server, node = cluster.servers[0], cluster.storage[0]
        wait_for(f"127.0.0.1:{server.health_port}", server_health.partition_name(0), "SERVING")
        assert status(f"127.0.0.1:{node.health_port}", "") == "SERVING"
        # kubelet's grpc probe speaks plaintext: the service ports refuse it, the health ports do not.
        assert status(server.address, "") == "UNAVAILABLE"
        assert status(f"127.0.0.1:{node.port}", "") == "UNAVAILABLE"
        operator = cluster.tls_files("operator")
        assert status(server.address, server_health.PARTITIONS, operator) == "SERVING"
        assert isinstance(operator, tls.TlsFiles)


def test_readiness_and_partition_health_hold_through_a_zookeeper_outage(tmp_path):
    """Issue 32: owned partitions go on committing while ZooKeeper is down (their store sessions fence an old
    owner, not ZooKeeper), so neither readiness nor the partitions' health turns NOT_SERVING for it (before, both
    did, and the server held every append)."""
    with LocalCluster(
        tmp_path, storage_nodes=1, servers=1, partitions=1, server_overrides={"zookeeper.sessionTimeoutSeconds": 30.0}
    ) as cluster:
        server = cluster.servers[0]
        zookeeper = cluster.zookeeper_process
        assert zookeeper is not None
        wait_for(server.address, server_health.partition_name(0), "SERVING")
        zookeeper.kill()
        deadline = time.monotonic() + 30
        while "ZooKeeper connection suspended" not in server.new_log():
            assert time.monotonic() < deadline, "the server did not notice ZooKeeper's death"
            time.sleep(0.1)
        time.sleep(2 * INTERVAL_S)  # the statuses were recomputed since
        for name in ("", server_health.SERVICE, server_health.PARTITIONS, server_health.partition_name(0),
                     server_health.LIVE):
            assert status(server.address, name) == "SERVING", name
        zookeeper.start()  # same port and data, within the session timeout: the session survives
        wait_for(server.address, server_health.PARTITIONS, "SERVING", timeout=30)
        assert status(server.address, "") == "SERVING"
