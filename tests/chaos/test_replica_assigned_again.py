"""A storage node unassigned from a partition while it runs keeps its copy; assigned again (`waltz storage
assign`), it must catch up into the write set under a checked load. Appends had told it that its records were
committed beyond its low-water mark, so it refuses to be truncated to that mark; recovery used to ask for exactly
that at every try, and the replica never came back (until the node restarted and forgot what it was told).
Every acknowledged transaction is in the log exactly once and every assigned replica holds exactly the log."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from tests.chaos.cluster import (
    assigned_replicas_hold_the_log,
    chaos_cluster,
    healthy_owners,
    run,
    until,
)
from tests.chaos.load_history import LoadProcesses, read_checked
from tests.chaos.test_storage_lifecycle import STEP, assignments, waltz
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess


def write_set(cluster: LocalCluster, pid: int) -> set[str]:
    """The owner's write set of partition pid (GetServerPartitions); empty while it has none."""
    with grpc.insecure_channel(cluster.servers[0].address) as channel:
        try:
            reply = server_pb2_grpc.WaltzServerStub(channel).GetServerPartitions(
                server_pb2.ServerPartitionsRequest(), timeout=10)
        except grpc.RpcError:
            return set()
    return {node for p in reply.partitions if p.partition_id == pid for node in p.write_set}


def test_a_running_node_unassigned_and_assigned_again_catches_up(zookeeper: ZooKeeperProcess, cluster_root: str,
                                                                 tmp_path: Path) -> None:
    with chaos_cluster(tmp_path / "cluster", zookeeper.connect_string, cluster_root, servers=1) as cluster:
        run(lambda: scenario(cluster, tmp_path))


async def scenario(cluster: LocalCluster, workdir: Path) -> None:
    await healthy_owners(cluster)
    first = cluster.storage[0].connect_string
    load = LoadProcesses(workdir / "load", cluster.client_config(), processes=2, submitters=10)
    try:
        acked = await load.acknowledged_at_least(STEP, "before the changes", timeout=180)
        fourth = (await asyncio.to_thread(cluster.add_storage_node)).connect_string
        added = await asyncio.to_thread(waltz, cluster, "storage", "add-replica", "-s", fourth, "-p", "0")
        assert added.returncode == 0, added.stderr
        await until(lambda: {first, fourth} <= write_set(cluster, 0), "four replicas in the write set", timeout=60)
        out = await asyncio.to_thread(waltz, cluster, "storage", "unassign", "-s", first, "-p", "0")
        assert out.returncode == 0, out.stdout + out.stderr
        await until(lambda: fourth in (held := write_set(cluster, 0)) and first not in held,
                    f"{first} out of the write set", timeout=60)
        acked = await load.acknowledged_at_least(acked + 3 * STEP, "without first", timeout=180)
        out = await asyncio.to_thread(waltz, cluster, "storage", "assign", "-s", first, "-p", "0")
        assert out.returncode == 0, out.stdout + out.stderr
        t0 = time.monotonic()
        await until(lambda: first in write_set(cluster, 0), f"{first} back in the write set", timeout=90)
        print(f"[assigned again] back in the write set after {time.monotonic() - t0:.1f} s")
        acked = await load.acknowledged_at_least(acked + STEP, "with first back", timeout=180)
        submissions = await load.stop()
    finally:
        load.kill()
    log, _ = await read_checked(cluster, submissions, "[assigned again]")
    held = await asyncio.to_thread(assignments, cluster)
    serving = {n.name: held.get(n.connect_string, []) for n in cluster.storage}
    await assigned_replicas_hold_the_log(cluster, log, serving)
