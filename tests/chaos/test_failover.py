"""Failover decided by the servers' failure detector, not by ZooKeeper's session expiry (docs/failover.md).

The servers keep the default 30 s ZooKeeper session here, so a partition that moves within seconds was moved
by the failure detector while the failed owner was still registered. Each test then runs the history checker
(check_run): nothing acknowledged lost, nothing committed twice, nothing reported failed that committed, ids
dense, replicas identical. A cut between the owner and ZooKeeper alone is
tests/chaos/test_network_faults.py::test_a_server_cut_off_from_zookeeper_past_its_session_timeout (its peers
still see it, so only its session's expiry moves its partitions), which runs with the failure detector on too.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from tests.chaos.cluster import assignment, healthy_owners, server_partitions, servers_by_id, until, writing
from tests.chaos.test_faults import STEP, check_run, on_cluster, report
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

SESSION_S = 30.0
MOVED_WITHIN_S = 15.0  # well inside the 30 s session (the detector's own bound is about 3 s; the host is shared)


def registered(cluster: LocalCluster, server_id: int) -> bool:
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        return zk.exists(cluster.paths.server(server_id)) is not None
    finally:
        zk.stop()
        zk.close()


def off(cluster: LocalCluster, victim_id: int, moved: list[int]) -> bool:
    now = assignment(cluster)
    return all(now[pid].server_id != victim_id for pid in moved)


def test_kill_9_of_the_owner_moves_its_partitions_while_it_is_still_registered(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the kill")
            before = await asyncio.to_thread(assignment, cluster)
            servers = await servers_by_id(cluster)
            victim_id = before[0].server_id
            moved = sorted(pid for pid, o in before.items() if o.server_id == victim_id)
            killed_at = time.monotonic()
            await asyncio.to_thread(servers[victim_id].kill)
            await until(lambda: off(cluster, victim_id, moved), f"{moved} moved off server {victim_id}", MOVED_WITHIN_S)
            took = time.monotonic() - killed_at
            still = await asyncio.to_thread(registered, cluster, victim_id)
            acked = await writer.acknowledged_at_least(acked + STEP, "after the kill")
            await healthy_owners(cluster)
            after = await asyncio.to_thread(assignment, cluster)
        report("owner kill -9", f"partitions {moved} of server {victim_id} moved in {took:.2f} s, the dead server "
               f"{'still' if still else 'no longer'} registered then; {acked} acknowledged")
        assert still, "the partitions moved only once ZooKeeper expired the dead owner's session"
        for pid in moved:
            assert after[pid].generation > before[pid].generation
        await check_run(cluster, writer, "owner kill -9")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, **{"zookeeper.sessionTimeoutSeconds": SESSION_S})


def test_a_frozen_owner_loses_its_partitions_in_seconds_and_woken_does_not_take_them_back(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """SIGSTOP for 10 s: its partitions move after server.peerTimeout; woken (its ZooKeeper session never
    expired, so it is still registered), it serves none of them at the old generation: the clients it had
    follow the new owner, and whatever it does when it wakes is fenced."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the freeze")
            before = await asyncio.to_thread(assignment, cluster)
            servers = await servers_by_id(cluster)
            victim_id = before[0].server_id
            victim = servers[victim_id]
            moved = sorted(pid for pid, o in before.items() if o.server_id == victim_id)
            assert victim.process is not None
            stopped_at = time.monotonic()
            victim.process.send_signal(signal.SIGSTOP)
            try:
                await until(lambda: off(cluster, victim_id, moved), f"{moved} moved off server {victim_id}",
                            MOVED_WITHIN_S)
                took = time.monotonic() - stopped_at
                acked = await writer.acknowledged_at_least(acked + STEP, f"with server {victim_id} frozen")
                await asyncio.sleep(max(0.0, stopped_at + 10.0 - time.monotonic()))
            finally:
                victim.process.send_signal(signal.SIGCONT)
            woke_at = time.monotonic()
            held: dict[int, int] = {}

            async def stale() -> bool:  # it still serves a moved partition under the generation it lost
                answer = await server_partitions(cluster, victim.address)
                held.clear()
                held.update({p.partition_id: p.generation for p in answer.partitions})
                return any(held.get(pid) == before[pid].generation for pid in moved)

            while await stale() and time.monotonic() - woke_at < 2.0:
                await asyncio.sleep(0.05)
            let_go = time.monotonic() - woke_at
            acked = await writer.acknowledged_at_least(acked + STEP, f"after server {victim_id} woke")
            assert await asyncio.to_thread(registered, cluster, victim_id)
            await healthy_owners(cluster)
            after = await asyncio.to_thread(assignment, cluster)
            acked = await writer.acknowledged_at_least(acked + STEP, "with both servers again")
        report("owner SIGSTOP", f"partitions {moved} of server {victim_id} moved {took:.2f} s into a 10 s stop; woken, "
               f"it held {held} {let_go:.2f} s after SIGCONT; generations "
               f"{({p: o.generation for p, o in before.items()})} -> "
               f"{({p: o.generation for p, o in after.items()})}; {acked} acknowledged")
        for pid in moved:
            assert held.get(pid, before[pid].generation + 1) > before[pid].generation, (pid, held, before)
            assert after[pid].generation > before[pid].generation
        await check_run(cluster, writer, "owner SIGSTOP")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, **{"zookeeper.sessionTimeoutSeconds": SESSION_S})
