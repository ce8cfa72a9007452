"""Every component serves Prometheus metrics that pass `promtool check metrics` and follow our naming, and
gRPC health and reflection on each of its gRPC ports."""

from __future__ import annotations

import time

import pytest

from tests.integration.cli import observability as obs
from waltz_cli.main import main
from waltz_common.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.skipif(
    obs.promtool() is None, reason="promtool is missing: scripts/bootstrap installs it (Debian package prometheus)"
)


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    """One storage node and one server, after some traffic (so histograms and labelled series exist)."""
    cluster = make_cluster(storage_nodes=1, servers=1, partitions=2)
    run = None
    for _ in range(60):
        run = cli_main(cluster, "client", "validate", "-p", "1", "-n", "5", "--producers", "2")
        if run == 0:
            break
        time.sleep(1)
    assert run == 0, "client validate did not pass"
    return cluster


def cli_main(cluster: LocalCluster, *argv: str) -> int:
    return main(["--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, *argv])


def _check_endpoint(metrics_port: int, prefix: str, grpc_ports: dict[int, str]) -> None:
    exposition = obs.scrape(metrics_port)
    assert obs.promtool_problems(exposition) == ""
    assert obs.naming_problems(exposition, prefix) == []
    for port, service in grpc_ports.items():
        target = f"127.0.0.1:{port}"
        assert obs.health_status(target) == "SERVING", target
        expected = {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                    "grpc.reflection.v1.ServerReflection"}
        for version in ("v1", "v1alpha"):  # grpcurl and current tools ask v1 first
            assert expected <= obs.reflected_services(target, version), (target, version)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "waltz_build_info{"):
        assert name in exposition, name


def test_storage_node_metrics_health_and_reflection(cluster):
    node = cluster.storage[0]
    services = {node.port: "waltz.v1.WaltzStorage", node.admin_port: "waltz.v1.WaltzStorageAdmin"}
    _check_endpoint(node.metrics_port, "waltz_storage_", services)
    exposition = obs.scrape(node.metrics_port)
    assert "waltz_storage_fsync_duration_seconds_count" in exposition
    assert 'component="storage"' in exposition
    assert 'waltz_storage_connections{port="storage"}' in exposition  # the server's store sessions
    assert 'waltz_storage_streams{port="admin"} 0.0' in exposition


def test_server_metrics_health_and_reflection(cluster):
    server = cluster.servers[0]
    _check_endpoint(server.metrics_port, "waltz_server_", {server.port: "waltz.v1.WaltzServer"})
    exposition = obs.scrape(server.metrics_port)
    assert 'waltz_server_append_requests_total{partition="1",result="ok"} 10.0' in exposition
    assert 'component="server"' in exposition
    assert 'waltz_server_zookeeper_session{state="connected"} 1.0' in exposition
    for name in ("waltz_server_client_streams ", "waltz_server_client_connections ",
                 'waltz_server_client_calls_refused_total{reason="connections"} 0.0'):
        assert name in exposition, name


def test_naming_check_catches_bad_names():
    bad = (
        "# TYPE waltz_storage_requests counter\nwaltz_storage_requests 1\n"
        "# TYPE other_thing gauge\nother_thing 1\n"
        '# TYPE waltz_storage_latency_ms gauge\nwaltz_storage_latency_ms{client_id="7"} 1\n'
    )
    problems = obs.naming_problems(bad, "waltz_storage_")
    assert "other_thing: not prefixed waltz_storage_" in problems
    assert "waltz_storage_latency_ms: not in base units" in problems
    assert any("high-cardinality" in p for p in problems)
