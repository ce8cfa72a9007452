"""A storage node is ready only when it holds every partition ZooKeeper assigns it, caught up: on real processes,
a node whose directory was wiped and which was started again (holding none of its partitions; the servers log
UNKNOWN_PARTITION) reports NOT_SERVING, and says why, until `waltz storage sync` has created its partitions and a
server's store session has filled them; then SERVING. It used to report ready at once: a Kubernetes rollout would
have gone on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.health_probe import status, wait_for
from waltz_common.testing.local_cluster import LocalCluster
from waltz_storage import health as storage_health
from waltz_storage.admin_client import StorageAdminClient

WALTZ = Path(sys.executable).parent / "waltz"
PARTITIONS = 2
VIEW_S = 5.0  # longer than the node's ZooKeeper view (2 s) and health (1 s) intervals together


def waltz(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(WALTZ), "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def held(cluster: LocalCluster, index: int) -> dict[int, int]:
    """partition -> max transaction id on storage node index."""
    node = cluster.storage[index]
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, PARTITIONS) as admin:
        return {p.partition_id: p.max_transaction_id for p in admin.list_partitions()}


def test_a_wiped_storage_node_is_not_ready_until_it_holds_its_partitions_caught_up(tmp_path, zookeeper, cluster_root):
    with LocalCluster(tmp_path / "cluster", storage_nodes=3, servers=1, partitions=PARTITIONS,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root,
                      server_overrides={"storage.maxRetryInterval": 1000}) as cluster:
        addresses = [f"127.0.0.1:{n.port}" for n in cluster.storage]
        for address in addresses:
            wait_for(address, "", "SERVING", timeout=60)
        server = cluster.servers[0].address
        produced = waltz(cluster, "perf", "produce", "--server-addresses", server, "-d", "2", "--json")
        assert json.loads(produced.stdout)["transactions"] > 0
        before = held(cluster, 0)
        assert min(before.values()) >= 0, before

        victim = cluster.storage[2]
        victim.stop()
        shutil.rmtree(victim.directory)
        victim.directory.mkdir()
        victim.start()
        assert held(cluster, 2) == {}  # wiped: it holds nothing
        deadline = time.monotonic() + VIEW_S
        while time.monotonic() < deadline:  # not ready, and stays so
            assert status(addresses[2], "") == "NOT_SERVING"
            time.sleep(0.25)
        for pid in range(PARTITIONS):
            assert status(addresses[2], storage_health.partition_name(pid)) == "NOT_SERVING"
        assert "assigned to this node in ZooKeeper but not held here" in victim.new_log()
        assert all(status(a, "") == "SERVING" for a in addresses[:2])

        waltz(cluster, "storage", "sync")
        took = wait_for(addresses[2], "", "SERVING", timeout=90)
        now = held(cluster, 2)
        assert set(now) == set(range(PARTITIONS))
        assert all(now[pid] >= before[pid] for pid in range(PARTITIONS)), (now, before)
        print(f"[readiness] the wiped node was SERVING {took:.1f} s after `waltz storage sync`, holding {now}")
