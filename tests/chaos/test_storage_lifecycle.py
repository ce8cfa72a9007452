"""A storage node's life under a checked load (several client processes, every submission checked afterwards):
a node's disk is lost (kill -9, the directory wiped, a restart on its old address) and `waltz storage replace` brings
it back; another's is lost while the server is down, so that ZooKeeper still counts it as a voter when it is back:
`waltz storage sync` refuses to bring it back empty, `replace` takes it out of the votes first; then a new node is
added and an old one retired onto it with `waltz storage retire`; the retired node comes back and takes a fourth
replica of a partition with `waltz storage add-replica` once its old copies are deleted. Every acknowledged
transaction is in the log exactly once and every assigned replica holds exactly the log. The commands are the ones
docs/operations.md's runbooks give.

WALTZ_SLOW=1 runs more load per step and drains the new node's other partitions back."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.chaos.cluster import (
    PARTITIONS,
    assigned_replicas_hold_the_log,
    chaos_cluster,
    healthy_owners,
    run,
    until,
)
from tests.chaos.load_history import LoadProcesses, read_checked
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster, StorageNode
from waltz_common.testing.zookeeper import ZooKeeperProcess

SLOW = os.environ.get("WALTZ_SLOW") == "1"
STEP = 400 if SLOW else 100  # acknowledged appends between one operation and the next
WALTZ = Path(sys.executable).parent / "waltz"


def waltz(cluster: LocalCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WALTZ), "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, *argv],
        capture_output=True, text=True, timeout=600,
    )


def wipe(node: StorageNode) -> None:
    """The disk is lost: kill -9, its storage directory emptied, the node started again on its old address."""
    node.kill()
    shutil.rmtree(node.directory)
    node.directory.mkdir(parents=True)
    node.start()


def assignments(cluster: LocalCluster) -> dict[str, list[int]]:
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        return cluster_admin.replica_assignments(zk, cluster.paths)
    finally:
        zk.stop()
        zk.close()


def test_replace_a_wiped_node_then_retire_another_onto_a_new_one(zookeeper: ZooKeeperProcess, cluster_root: str,
                                                                  tmp_path: Path) -> None:
    with chaos_cluster(tmp_path / "cluster", zookeeper.connect_string, cluster_root, servers=1) as cluster:
        run(lambda: scenario(cluster, tmp_path))


async def scenario(cluster: LocalCluster, workdir: Path) -> None:
    await healthy_owners(cluster)
    every = list(range(PARTITIONS))
    first, second, third = (n.connect_string for n in cluster.storage)
    load = LoadProcesses(workdir / "load", cluster.client_config(), processes=2, submitters=10)
    try:
        acked = await load.acknowledged_at_least(STEP, "before the first disk is lost", timeout=180)

        # 1. The common case: the owner goes on without the node, so it is out of the votes by the time it is back.
        await asyncio.to_thread(wipe, cluster.storage[2])
        replaced = await asyncio.to_thread(waltz, cluster, "storage", "replace", "-s", third)
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        assert f"{third}: replaced partitions 0-{PARTITIONS - 1}" in replaced.stdout
        assert all(f"partition {pid}: create {third}" in replaced.stderr for pid in every)
        acked = await load.acknowledged_at_least(acked + STEP, "after the first replacement", timeout=180)

        # 2. The node is back before any store session ran without it (here: the server was down meanwhile), so
        # ZooKeeper still counts it as a voter: sync refuses to bring it back empty, replace takes it out first.
        server = cluster.servers[0]
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(wipe, cluster.storage[1])
        refused = await asyncio.to_thread(waltz, cluster, "storage", "sync", "-s", second)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"{second} is a voting member of partition" in refused.stderr
        assert f"waltz storage replace -s {second}" in refused.stderr
        replacing = asyncio.ensure_future(asyncio.to_thread(waltz, cluster, "storage", "replace", "-s", second))
        await until(lambda: second not in assignments(cluster), f"replace unassigned {second}", timeout=60)
        await asyncio.to_thread(server.start)  # its first sessions run without the empty node
        replaced = await replacing
        assert replaced.returncode == 0, replaced.stdout + replaced.stderr
        said = replaced.stderr
        for pid in every:  # out of the votes before it holds anything again
            unassigned, created = (said.index(f"partition {pid}: {step} {second}") for step in ("unassign", "create"))
            assert unassigned < created
        acked = await load.acknowledged_at_least(acked + STEP, "after the second replacement", timeout=180)

        # 3. Grow onto a new node and retire an old one.
        fourth = (await asyncio.to_thread(cluster.add_storage_node)).connect_string
        retired = await asyncio.to_thread(waltz, cluster, "storage", "retire", "-s", first, "--to", fourth)
        assert retired.returncode == 0, retired.stdout + retired.stderr
        assert f"{first}: retired" in retired.stdout
        held = await asyncio.to_thread(assignments, cluster)
        assert first not in held and held[fourth] == every and held[second] == every and held[third] == every
        acked = await load.acknowledged_at_least(acked + STEP, "after the retirement", timeout=180)

        # 4. The retired node comes back (registered anew): its old copies are refused as replicas until deleted,
        # then it takes an extra replica of partition 0 (four replicas), and with WALTZ_SLOW=1 the rest back.
        again = await asyncio.to_thread(waltz, cluster, "storage", "add-node", "-s", first, "-a",
                                        str(cluster.storage[0].admin_port), "-g", "0")
        assert again.returncode == 0, again.stderr
        stale = await asyncio.to_thread(waltz, cluster, "storage", "add-replica", "-s", first, "-p", "0")
        assert stale.returncode == 1 and f"{first} holds an old copy of partition 0" in stale.stderr, stale.stderr
        deleted = await asyncio.to_thread(waltz, cluster, "storage", "remove-partition", "-s", first, "-p",
                                          f"0-{PARTITIONS - 1}", "-d")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        added = await asyncio.to_thread(waltz, cluster, "storage", "add-replica", "-s", first, "-p", "0")
        assert added.returncode == 0, added.stdout + added.stderr
        assert (await asyncio.to_thread(assignments, cluster))[first] == [0]
        acked = await load.acknowledged_at_least(acked + STEP, "with four replicas of partition 0", timeout=180)
        if SLOW:
            drained = await asyncio.to_thread(waltz, cluster, "storage", "drain", "-s", fourth, "--to", first, "-p",
                                              f"1-{PARTITIONS - 1}")
            assert drained.returncode == 0, drained.stdout + drained.stderr
            await load.acknowledged_at_least(acked + STEP, "after draining back", timeout=180)
        submissions = await load.stop()
    finally:
        load.kill()
    log, _ = await read_checked(cluster, submissions, "[lifecycle]")
    held = await asyncio.to_thread(assignments, cluster)
    serving = {n.name: held[n.connect_string] for n in cluster.storage if n.connect_string in held}
    assert sorted(len(pids) for pids in serving.values()) == [1, 4, 4, 4]  # slow: first and fourth swapped
    await assigned_replicas_hold_the_log(cluster, log, serving)
