"""Failover: kill -9 of the server owning the partition under load, until the first commit on the new owner.

    .venv/bin/python -m bench.curves.failover [--quick]

A LocalCluster (3 storage replicas, 2 servers, 1 partition) and, in this process, an AsyncWaltzClient with 10
closed-loop writers (512 B). After a warmup the owner gets SIGKILL; the time to failover is from the kill to
the commit of the first append submitted after it (only the new owner can commit that one). Its ZooKeeper
session timeout (zookeeper.sessionTimeout: how long ZooKeeper keeps the dead owner's session, so its
ownership) is part of it: the table shows it next to the rest. The baseline, in the same run, is the commit
latency before the kill (p50, p99). Full: the default timeout (30 s) and 6 s; --quick: 6 s only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Append, CountingCallbacks
from bench.baselines import percentile
from bench.curves.common import LoadLog, main_for, owners, server_address, table, wait_owned
from waltz_client import AsyncWaltzClient
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

WRITERS = 10
WARMUP_S = 3.0
GIVE_UP_S = 120.0


def _expired(cluster: LocalCluster, server_id: int, since: float) -> float:
    """Seconds from since until the server's ephemeral registration is gone (ZooKeeper expired its session)."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        while zk.exists(cluster.paths.server(server_id)) is not None:
            if time.perf_counter() - since > GIVE_UP_S:
                raise TimeoutError(f"server {server_id}'s session did not expire within {GIVE_UP_S:g} s")
            time.sleep(0.01)
        return time.perf_counter() - since
    finally:
        zk.stop()
        zk.close()


async def _under_load(cluster: LocalCluster) -> tuple[float, float, list[float], int]:
    """(seconds from the kill to the first commit of an append submitted after it, seconds from the kill to the
    dead owner's session expiry, latencies before, errors)."""
    config = {**cluster.client_config(**WRITER_CLIENT), "client.autoMount": False,
              "client.maxConcurrentTransactions": WRITERS}
    callbacks = CountingCallbacks(-1)
    killed_at = 0.0
    before: list[float] = []
    after: list[float] = []  # commit times of appends submitted after the kill
    errors = 0
    stop = asyncio.Event()
    async with AsyncWaltzClient(callbacks, config) as client:
        callbacks.hwm = await client.high_water_mark(0)
        client.mount_partitions([0])
        await client.wait_mounted()

        async def writer() -> None:
            nonlocal errors
            payload = b"x" * 512
            while not stop.is_set():
                submitted = time.perf_counter()
                try:
                    await (await client.submit(Append(payload)))
                except Exception:
                    errors += 1
                    await asyncio.sleep(0.01)
                    continue
                done = time.perf_counter()
                if not killed_at:
                    before.append(done - submitted)
                elif submitted > killed_at:
                    after.append(done)
                    stop.set()

        writers = [asyncio.create_task(writer()) for _ in range(WRITERS)]
        await asyncio.sleep(WARMUP_S)
        owner_id = owners(cluster)[0]
        address = server_address(cluster, owner_id)
        owner = next(s for s in cluster.servers if s.address == address)
        killed_at = time.perf_counter()
        await asyncio.to_thread(owner.kill)
        expired = asyncio.create_task(asyncio.to_thread(_expired, cluster, owner_id, killed_at))
        await asyncio.wait_for(stop.wait(), GIVE_UP_S)
        await asyncio.gather(*writers)
        expiry = await expired
    return min(after) - killed_at, expiry, before, errors


def failover(workdir: Path, zookeeper: str, session_ms: int) -> tuple[float, float, list[float], int]:
    with LocalCluster(workdir / f"s{session_ms}", servers=2, zookeeper=zookeeper, cluster_root=f"/bench/fo{session_ms}",
                      server_overrides={"zookeeper.sessionTimeout": session_ms}) as cluster:
        wait_owned(cluster, 1)
        return asyncio.run(_under_load(cluster))


def run(workdir: Path, quick: bool) -> str:
    timeouts = (6000,) if quick else (30000, 6000)
    load = LoadLog()
    rows: list[list[object]] = []
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper:
        load.mark("start")
        for session_ms in timeouts:
            seconds, expiry, before, errors = failover(workdir, zookeeper.connect_string, session_ms)
            rows.append([f"zookeeper.sessionTimeout {session_ms:,} ms", seconds, expiry, seconds - expiry,
                         expiry / seconds, percentile(before, 0.5) * 1e3, percentile(before, 0.99) * 1e3, errors])
            load.mark(f"{session_ms} ms")
    head = ["", "kill to first commit s", "kill to session expiry s", "the rest s", "expiry share", "p50 ms before",
            "p99 ms before", "errors"]
    return "\n".join([
        load.line(), "",
        f"kill -9 of the owning server under {WRITERS} closed-loop writers (2 servers, 3 storage replicas, "
        "1 partition)",
        table(head, rows),
        "session expiry: when the dead owner's ephemeral registration went (ZooKeeper expires a session within "
        "the timeout of its last heartbeat); expiry share: that / the failover time; the rest: the new assignment, "
        "the partition's recovery on the new owner, the client's remount. p50/p99 before: commit latency before "
        "the kill (the baseline).",
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
