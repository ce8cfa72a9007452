"""Every component serves Prometheus metrics that pass `promtool check metrics` and follow our naming, and
gRPC health and reflection on each of its gRPC ports."""

from __future__ import annotations

import pytest

from tests.integration.cli import observability as obs
from waltz_common.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.skipif(
    obs.promtool() is None, reason="promtool is missing: scripts/bootstrap installs it (Debian package prometheus)"
)


@pytest.fixture
def storage_only(make_cluster) -> LocalCluster:
    return make_cluster(storage_nodes=1, servers=0, partitions=2)


def test_storage_node_metrics_health_and_reflection(storage_only):
    node = storage_only.storage[0]
    exposition = obs.scrape(node.metrics_port)
    assert obs.promtool_problems(exposition) == ""
    assert obs.naming_problems(exposition, "waltz_storage_") == []
    assert "waltz_storage_fsync_duration_seconds_bucket" in exposition
    for port, service in ((node.port, "waltz.v1.WaltzStorage"), (node.admin_port, "waltz.v1.WaltzStorageAdmin")):
        target = f"127.0.0.1:{port}"
        assert obs.health_status(target) == "SERVING"
        assert {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= (
            obs.reflected_services(target)
        )


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
