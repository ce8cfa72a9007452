"""Submits waiting for a pending-append slot when their partition loses its only server: they fail after
client.mountTimeout, the documented wait while a partition is not mounted, not after client.requestTimeout.

The storage nodes are frozen (SIGSTOP) so that the appends already sent stay pending and hold every slot; more
submits queue for a slot; then the server is killed (kill -9) and not restarted, so the partition unmounts and
cannot mount again. The waiters' time-out timer had been armed while the partition was mounted, for
client.requestTimeout, and nothing armed it for the shorter mount timeout until another submit came: with no
other submit, they waited the request timeout."""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

from tests.chaos.cluster import Recorder, chaos_cluster, healthy_owners, run
from tests.chaos.history import Append
from waltz_client import AsyncWaltzClient, WaltzTimeoutError
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

MOUNT_S, REQUEST_S = 2.0, 40.0
SLOTS, WAITING = 2, 8


def test_slot_waiters_time_out_after_the_mount_timeout_once_unmounted(zookeeper: ZooKeeperProcess, cluster_root: str,
                                                                       tmp_path: Path) -> None:
    with chaos_cluster(tmp_path / "cluster", zookeeper.connect_string, cluster_root, servers=1) as cluster:
        run(lambda: scenario(cluster))


async def scenario(cluster: LocalCluster) -> None:
    await healthy_owners(cluster)
    config = {**cluster.client_config(), "client.maxConcurrentTransactions": SLOTS, "client.mountTimeout": MOUNT_S,
              "client.requestTimeout": REQUEST_S}
    tag = uuid.uuid4().hex[:8]
    frozen = [node.pid for node in cluster.storage if node.pid is not None]
    client = AsyncWaltzClient(Recorder(), config)
    await client.start()
    try:
        await client.wait_mounted()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        held = [await client.submit(Append(tag, i, 0)) for i in range(SLOTS)]  # pending: every slot is held
        waiting = [asyncio.create_task(client.submit(Append(tag, SLOTS + i, 0))) for i in range(WAITING)]
        await asyncio.sleep(MOUNT_S + 0.5)  # past their mount deadline already, still mounted
        assert not any(task.done() for task in waiting), "a submit got a slot the pending appends hold"
        await asyncio.to_thread(cluster.servers[0].kill)  # kill -9; no server is left to mount on
        killed = time.monotonic()
        outcomes = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), REQUEST_S * 2)
        waited = time.monotonic() - killed
        print(f"[slot waits] {WAITING} waiters ended {waited:.1f} s after the server's kill: "
              f"{sorted({type(o).__name__ for o in outcomes})}")
        assert all(isinstance(o, WaltzTimeoutError) and "client.mountTimeout" in str(o) for o in outcomes), outcomes
        # past their mount deadline at the kill: they end as soon as the client sees the partition unmounted, not
        # client.requestTimeout after they began to wait
        assert waited < REQUEST_S / 2, f"the waiters ended {waited:.1f} s after the kill"
        del held
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(client.close(flush=False), 60)
