"""The shipped alert rules in a real Prometheus (Debian's binary) scraping a local cluster: every metric the rules
name is scraped, and nothing fires while the cluster is healthy; a storage node's graceful restart sets nothing
pending; kill -9 a storage node and WaltzPartitionUnderReplicated, WaltzPartitionBelowReplicationFactor,
WaltzTargetDown and WaltzFewerProcessesThanExpected fire (and WaltzPartitionWithoutQuorum does not: two of three are
left); unassign its replicas and WaltzPartitionUnderReplicated clears while WaltzPartitionBelowReplicationFactor
stays; assign them and start it again and every alert clears; kill -9 the server and WaltzTargetDown fires for it.

Every file of helm/waltz/files/rules is loaded as shipped, except that each rule's `for:` is cut to a few seconds
so the test takes seconds, not minutes: the expressions meet real metrics here, while the durations are checked
by the promtool unit tests (tests/unit/test_alert_rules.py)."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster, ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm/waltz/files/rules"
PARTITIONS = 2
FOR = "2s"  # every rule's `for:` in this test

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus is missing: scripts/bootstrap installs it (Debian package)"
)


class Prometheus:
    """A Prometheus server on a free loopback port, with its data in a directory of its own."""

    def __init__(self, workdir: Path, targets: dict[str, list[str]], expected: dict[str, int]) -> None:
        rules = workdir / "rules"
        rules.mkdir()
        # what the cluster should have, as docs/operations.md's waltz-expected.yaml says it
        (workdir / "expected.yaml").write_text(yaml.safe_dump({"groups": [{"name": "waltz-expected", "rules": [
            {"record": "waltz_expected_processes", "expr": f"vector({expected['server']})",
             "labels": {"component": "server"}},
            {"record": "waltz_expected_processes", "expr": f"vector({expected['storage']})",
             "labels": {"component": "storage"}},
            {"record": "waltz_expected_replication_factor", "expr": f"vector({expected['replication']})"},
        ]}]}))
        for path in sorted(RULES.glob("*.yaml")):
            document = yaml.safe_load(path.read_text())
            for group in document["groups"]:
                for rule in group["rules"]:
                    if "for" in rule:
                        rule["for"] = FOR
            (rules / path.name).write_text(yaml.safe_dump(document))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules / "*.yaml"), str(workdir / "expected.yaml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": addresses}]} for job, addresses in targets.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.process = ManagedProcess(
            "prometheus",
            ["prometheus", f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--config.file"],
            workdir / "prometheus.yml", workdir / "prometheus.log", "Server is ready to receive web requests.",
        )
        self.process.start(timeout=60)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}", timeout=5) as answer:
            return json.loads(answer.read())["data"]

    def alerts(self, state: str = "firing") -> list[dict[str, str]]:
        """The labels of the alerts in state (firing or pending)."""
        return [a["labels"] for a in self.api("alerts")["alerts"] if a["state"] == state]

    def wait(self, what: str, check: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            if not self.process.running:
                raise RuntimeError(f"prometheus exited: {self.process.new_log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout} s; alerts: {self.api('alerts')}")
            time.sleep(0.25)
        return found


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: Any, cluster_root: str) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", storage_nodes=3, servers=1, partitions=PARTITIONS,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root) as started:
        yield started


@pytest.fixture
def prometheus(tmp_path: Path, cluster: LocalCluster) -> Iterator[Prometheus]:
    targets = {
        "waltz-server": [f"127.0.0.1:{s.metrics_port}" for s in cluster.servers],
        "waltz-storage": [f"127.0.0.1:{n.metrics_port}" for n in cluster.storage],
    }
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    expected = {"server": len(cluster.servers), "storage": len(cluster.storage), "replication": len(cluster.storage)}
    server = Prometheus(workdir, targets, expected)
    try:
        yield server
    finally:
        server.process.stop()


def write_sets(prometheus: Prometheus) -> dict[str, float]:
    """partition -> replicas in its write set, as Prometheus has scraped them."""
    result = prometheus.api("query", query='waltz_server_partition_replicas{state="write_set"}')["result"]
    return {r["metric"]["partition"]: float(r["value"][1]) for r in result}


def scraped_names(prometheus: Prometheus) -> set[str]:
    """The metric names the targets expose, also the families without a sample yet (from their HELP/TYPE)."""
    names = set(prometheus.api("label/__name__/values"))
    for family in prometheus.api("metadata"):
        names |= {family, f"{family}_total", f"{family}_bucket"}
    return names


def rule_metric_names() -> set[str]:
    wanted = set()
    for path in RULES.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            wanted |= {name for rule in group["rules"] for name in re.findall(r"\bwaltz_\w+", rule["expr"])}
    return wanted


def test_the_under_replication_alert_fires_when_a_storage_node_dies_and_clears_when_it_is_back(
        cluster: LocalCluster, prometheus: Prometheus):
    every = {str(p) for p in range(PARTITIONS)}
    loaded = prometheus.wait("the rules loaded", lambda: prometheus.api("rules")["groups"], timeout=60)
    assert {g["file"].rsplit("/", 1)[-1] for g in loaded} == {p.name for p in RULES.glob("*.yaml")} | {"expected.yaml"}
    prometheus.wait("every partition's three replicas in the write set",
                    lambda: write_sets(prometheus) == dict.fromkeys(every, 3.0), timeout=60)
    # a renamed metric would leave its alert silent for ever: every waltz_ name the rules ask for is scraped
    assert "waltz_server_partition_replicas" in rule_metric_names()
    prometheus.wait("both kinds of target scraped", lambda: {"waltz_storage_partition_max_transaction_id",
                                                              "waltz_server_partitions"} <= scraped_names(prometheus),
                    timeout=60)
    assert sorted(rule_metric_names() - scraped_names(prometheus)) == []
    time.sleep(3)  # longer than every `for:`: a healthy cluster fires nothing, pending included
    assert prometheus.alerts("firing") == [] and prometheus.alerts("pending") == []

    # a graceful restart of a storage node: the store sessions reopen, and nothing goes even pending for quorum.
    # The write set reads 0 for a moment (about 0.1 s here, seconds under load), which a scrape may or may not see;
    # the promtool test (tests/replication.test.yaml) puts such a scrape in the series every time.
    seen: set[str] = set()

    def back_in_write_sets() -> bool:
        seen.update(a["alertname"] for state in ("pending", "firing") for a in prometheus.alerts(state))
        return write_sets(prometheus) == dict.fromkeys(every, 3.0)

    cluster.storage[0].stop()
    cluster.storage[0].start()
    prometheus.wait("the restarted replica back in every write set", back_in_write_sets, timeout=90)
    assert "WaltzPartitionWithoutQuorum" not in seen, seen

    dead = cluster.storage[2]
    dead.kill()  # kill -9

    def firing(name: str) -> set[str]:
        return {a.get("partition") or a.get("component", "") for a in prometheus.alerts() if a["alertname"] == name}

    prometheus.wait("WaltzPartitionUnderReplicated firing for every partition",
                    lambda: firing("WaltzPartitionUnderReplicated") == every, timeout=60)
    prometheus.wait("WaltzPartitionBelowReplicationFactor firing for every partition",
                    lambda: firing("WaltzPartitionBelowReplicationFactor") == every, timeout=60)
    prometheus.wait("WaltzTargetDown and WaltzFewerProcessesThanExpected firing for the storage node",
                    lambda: firing("WaltzTargetDown") == firing("WaltzFewerProcessesThanExpected") == {"storage"},
                    timeout=60)
    (down,) = [a for a in prometheus.alerts() if a["alertname"] == "WaltzTargetDown"]
    assert down["instance"] == f"127.0.0.1:{dead.metrics_port}"
    assert write_sets(prometheus) == dict.fromkeys(every, 2.0)
    assert not firing("WaltzPartitionWithoutQuorum")
    assert {a["severity"] for a in prometheus.alerts()} == {"warning"}

    # the dead replica unassigned: the partitions run on two replicas as assigned, yet below the replication factor
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        cluster_admin.unassign_partitions(zk, cluster.paths, dead.connect_string, range(PARTITIONS))
        prometheus.wait("WaltzPartitionUnderReplicated cleared by the unassignment",
                        lambda: not firing("WaltzPartitionUnderReplicated"), timeout=60)
        assert firing("WaltzPartitionBelowReplicationFactor") == every
        cluster_admin.assign_partitions(zk, cluster.paths, dead.connect_string, range(PARTITIONS))
    finally:
        zk.stop()
        zk.close()
    dead.start()

    def all_clear() -> bool:
        return prometheus.alerts("firing") == [] and prometheus.alerts("pending") == []

    prometheus.wait("every alert cleared", all_clear, timeout=90)
    assert write_sets(prometheus) == dict.fromkeys(every, 3.0)

    server = cluster.servers[0]
    server.kill()
    prometheus.wait("WaltzTargetDown firing for the server", lambda: "server" in firing("WaltzTargetDown"), timeout=60)
    assert "server" in firing("WaltzFewerProcessesThanExpected")
