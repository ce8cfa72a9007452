"""Failover: kill -9 or a 10 s SIGSTOP of the server owning the partition under load, to the first commit after it.

    .venv/bin/python -m bench.curves.failover [--quick] [--faults kill,restart,stop]

A LocalCluster (3 storage replicas, 2 servers, 1 partition) and, in this process, an AsyncWaltzClient with 10
closed-loop writers (512 B), finding owners through ZooKeeper (and, in a third part, from the servers' addresses
alone, client.servers). After a warmup the owner gets SIGKILL (then it is started again, under a new id,
for the next round) or SIGSTOP for 10 s (then SIGCONT). The time to failover is from the signal to the commit
of the first append submitted after it. Each fault is repeated (5 times, 2 with --quick) twice in the same run:
with the servers' failure detector (server.peerDetection, the default: a dead owner is found by its peers
within about a second, a frozen one after server.peerTimeout) and without it, the old timings, where only
ZooKeeper's session expiry (zookeeper.sessionTimeout, 30 s by default; 6 s with --quick) moves the
partition, and a frozen owner keeps it until it wakes. The baseline, in the same run, is the commit latency
before the first fault (p50, p99).

The "restart" fault is what a container runtime does (issue 32): the killed owner is started again at once on
its old address (under a new id), and the next round kills the new owner while the first one's ZooKeeper
session has not expired yet: its registration is a ghost whose address answers, which must not delay the
failover (docs/failover.md, "A peer is an incarnation").
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Append, CountingCallbacks
from bench.baselines import percentile
from bench.curves.common import LoadLog, main_for, owners, server_address, table, wait_owned
from waltz_client import AsyncWaltzClient
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster, ServerNode
from waltz_common.testing.zookeeper import ZooKeeperProcess

WRITERS = 10
WARMUP_S = 3.0
SETTLE_S = 4.0  # after a round: the restarted or woken server is judged alive again (server.peerRejoin, 2 s)
STOP_S = 10.0
GIVE_UP_S = 120.0
KILL_TARGET_S = 2.0
STOP_TARGET_S = 5.0


@dataclass
class Round:
    fault: str
    seconds: float  # signal to the first commit of an append submitted after it
    moved: bool  # that commit was on another server than the one faulted
    expiry: float | None = None  # signal to the faulted server's registration going (None: it stayed)
    ghost: bool = False  # restart: the killed server's registration was still in ZooKeeper after the round


@dataclass
class Load:
    """Closed-loop writers on one client: (submitted, committed) of every commit, monotonic seconds."""

    client: AsyncWaltzClient
    commits: list[tuple[float, float]] = field(default_factory=list)
    errors: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def writer(self) -> None:
        payload = b"x" * 512
        while not self.stop.is_set():
            submitted = time.perf_counter()
            try:
                await (await self.client.submit(Append(payload)))
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.01)
                continue
            self.commits.append((submitted, time.perf_counter()))

    async def first_commit_after(self, moment: float) -> float:
        """Seconds from moment to the first commit of an append submitted after it."""
        deadline = time.perf_counter() + GIVE_UP_S
        while time.perf_counter() < deadline:
            after = [done for submitted, done in self.commits[-10 * WRITERS:] if submitted > moment]
            if after:
                return min(after) - moment
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no commit within {GIVE_UP_S:g} s of the fault")


def _registered(cluster: LocalCluster, server_id: int) -> bool:
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        return zk.exists(cluster.paths.server(server_id)) is not None
    finally:
        zk.stop()
        zk.close()


def _expired(cluster: LocalCluster, server_id: int, since: float, limit: float) -> float | None:
    """Seconds from since until the server's registration is gone (None: still there after limit seconds)."""
    while _registered(cluster, server_id):
        if time.perf_counter() - since > limit:
            return None
        time.sleep(0.05)
    return time.perf_counter() - since


def _owner(cluster: LocalCluster) -> tuple[int, ServerNode]:
    owner_id = owners(cluster)[0]
    address = server_address(cluster, owner_id)
    return owner_id, next(s for s in cluster.servers if s.address == address and s.running)


async def _kill(cluster: LocalCluster, load: Load) -> Round:
    owner_id, owner = await asyncio.to_thread(_owner, cluster)
    killed_at = time.perf_counter()
    await asyncio.to_thread(owner.kill)
    expiry = asyncio.create_task(asyncio.to_thread(_expired, cluster, owner_id, killed_at, GIVE_UP_S))
    seconds = await load.first_commit_after(killed_at)
    new_owner = (await asyncio.to_thread(owners, cluster))[0]
    expired = await expiry
    await asyncio.to_thread(owner.start)  # back under a new id, for the next round
    return Round("kill -9", seconds, new_owner != owner_id, expired)


async def _kill_restart(cluster: LocalCluster, load: Load) -> Round:
    """kill -9 the owner and start it again at once on its address; the commit does not wait for the start."""
    owner_id, owner = await asyncio.to_thread(_owner, cluster)
    killed_at = time.perf_counter()
    await asyncio.to_thread(owner.kill)
    restarted = asyncio.create_task(asyncio.to_thread(owner.start))
    try:
        seconds = await load.first_commit_after(killed_at)
    finally:
        await restarted
    new_owner = (await asyncio.to_thread(owners, cluster))[0]
    ghost = await asyncio.to_thread(_registered, cluster, owner_id)
    return Round("kill -9, restart at once", seconds, new_owner != owner_id, ghost=ghost)


async def _freeze(cluster: LocalCluster, load: Load) -> Round:
    owner_id, owner = await asyncio.to_thread(_owner, cluster)
    assert owner.process is not None
    process = owner.process
    stopped_at = time.perf_counter()
    process.send_signal(signal.SIGSTOP)
    woken = asyncio.get_running_loop().call_later(STOP_S, process.send_signal, signal.SIGCONT)  # whatever happens
    try:
        seconds = await load.first_commit_after(stopped_at)
        new_owner = (await asyncio.to_thread(owners, cluster))[0]
        await asyncio.sleep(max(0.0, stopped_at + STOP_S - time.perf_counter()))
    finally:
        woken.cancel()
        process.send_signal(signal.SIGCONT)
    return Round(f"SIGSTOP {STOP_S:g} s", seconds, new_owner != owner_id, None)


Fault = Callable[[LocalCluster, Load], Awaitable[Round]]
FAULTS: dict[str, Fault] = {"kill": _kill, "restart": _kill_restart, "stop": _freeze}


async def _rounds(cluster: LocalCluster, repeats: int, by_servers: bool,
                  faults: list[str]) -> tuple[list[Round], list[float], int]:
    config = {**cluster.client_config(**WRITER_CLIENT), "client.autoMount": False,
              "client.maxConcurrentTransactions": WRITERS}
    if by_servers:  # discovery from server addresses alone (GetClusterInfo), no ZooKeeper in the client
        del config["zookeeper.connectString"], config["cluster.root"]
        config["client.servers"] = ",".join(s.address for s in cluster.servers)
    callbacks = CountingCallbacks(-1)
    rounds: list[Round] = []
    async with AsyncWaltzClient(callbacks, config) as client:
        callbacks.hwm = await client.high_water_mark(0)
        client.mount_partitions([0])
        await client.wait_mounted()
        load = Load(client)
        writers = [asyncio.create_task(load.writer()) for _ in range(WRITERS)]
        await asyncio.sleep(WARMUP_S)
        before = [done - submitted for submitted, done in load.commits]
        for name in faults:
            fault = FAULTS[name]
            for _ in range(repeats):
                rounds.append(await fault(cluster, load))
                await asyncio.to_thread(wait_owned, cluster, 1)
                await asyncio.sleep(SETTLE_S)
        load.stop.set()
        await asyncio.gather(*writers)
    return rounds, before, load.errors


def failover(workdir: Path, zookeeper: str, name: str, overrides: dict[str, Any], repeats: int,
             by_servers: bool = False, faults: tuple[str, ...] = tuple(FAULTS)) -> tuple[
        list[Round], list[float], int]:
    with LocalCluster(workdir / name, servers=2, zookeeper=zookeeper, cluster_root=f"/bench/fo-{name}",
                      server_overrides=overrides) as cluster:
        wait_owned(cluster, 1)
        return asyncio.run(_rounds(cluster, repeats, by_servers, list(faults)))


def run(workdir: Path, quick: bool, faults: tuple[str, ...] = tuple(FAULTS)) -> str:
    repeats = 2 if quick else 5
    session_ms = 6000 if quick else 30000
    modes = {
        "detection": {"zookeeper.sessionTimeout": session_ms},
        "servers": {"zookeeper.sessionTimeout": session_ms},
        "expiry": {"zookeeper.sessionTimeout": session_ms, "server.peerDetection": False},
    }
    labels = {"detection": "failure detector (default)",
              "servers": "failure detector, client.servers discovery",
              "expiry": f"old: session expiry only ({session_ms:,} ms)"}
    load = LoadLog()
    rows: list[list[object]] = []
    details: list[str] = []
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper:
        load.mark("start")
        for mode, overrides in modes.items():
            rounds, before, errors = failover(workdir, zookeeper.connect_string, mode, overrides, repeats,
                                              by_servers=mode == "servers", faults=faults)
            for fault in dict.fromkeys(r.fault for r in rounds):
                these = [r for r in rounds if r.fault == fault]
                seconds = [r.seconds for r in these]
                target = STOP_TARGET_S if fault.startswith("SIGSTOP") else KILL_TARGET_S
                verdict = "met" if max(seconds) <= target else "MISSED"
                rows.append([f"{labels[mode]}: {fault}", len(these), min(seconds), statistics.median(seconds),
                             max(seconds), sum(r.moved for r in these), f"<= {target:g}",
                             verdict if mode != "expiry" else f"({verdict})",
                             percentile(before, 0.5) * 1e3, percentile(before, 0.99) * 1e3, errors])
                details.append(f"{labels[mode]}, {fault}: signal to first commit s "
                               + ", ".join(f"{s:.2f}" for s in seconds)
                               + ("; signal to session expiry s " + ", ".join(
                                   f"{r.expiry:.1f}" if r.expiry is not None else "-" for r in these)
                                  if fault == "kill -9" else "")
                               + ("; the killed server's registration still there after the round: "
                                  + ", ".join("yes" if r.ghost else "no" for r in these)
                                  if fault.startswith("kill -9, restart") else ""))
            load.mark(mode)
    head = ["", "rounds", "min s", "median s", "worst s", "moved", "target", "worst vs target", "p50 ms before",
            "p99 ms before", "errors"]
    return "\n".join([
        load.line(), "",
        f"signal to the owning server -> first commit of an append submitted after it, under {WRITERS} closed-loop "
        "writers (2 servers, 3 storage replicas, 1 partition)",
        table(head, rows),
        *details,
        "moved: rounds whose first commit was on another server (a frozen owner that kept the partition commits "
        "again once it wakes); the targets (issue 26) apply to the failure detector's rows; p50/p99 before: commit "
        "latency before the first fault (the baseline); errors: appends that failed and were submitted again.",
    ])


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"which faults, comma-separated, of {', '.join(FAULTS)} (default: all)")
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    faults = tuple(f for f in known.faults.split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"--faults: choose among {', '.join(FAULTS)}")
    return main_for(__doc__.split("\n\n")[0], lambda workdir, quick: run(workdir, quick, faults))(rest)

if __name__ == "__main__":
    raise SystemExit(main(None))
