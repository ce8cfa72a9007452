"""Soak: random faults, one after another, on a real proxied cluster under a continuous load, for a chosen time.

    scripts/soak --minutes 30 [--seed N] [--dir DIR] [--keep]

ZooKeeper, 3 storage nodes and 2 servers run as processes, with a FaultProxy in front of each storage node's data
port, each server's client port and each server's ZooKeeper link (LocalCluster(proxied=True)). Three client processes
of 20 concurrent submitters each (tests/chaos/load_process.py; a third of the submissions under a write lock) append
unique payloads the whole time. Meanwhile the soak picks a fault at random (choose), inflicts it, holds it for a random
time, heals it, waits until every partition is healthy at its owner and appends are acknowledged again, and goes on
to the next. At the end it stops the load, heals everything and runs the history checker
(tests/chaos/load_history.py: nothing committed twice, nothing acknowledged lost, nothing reported failed that
committed, every lock's chain of writers unbroken, ids dense, replicas identical).

It prints a line per fault and a summary: appends acknowledged, faults done by kind, and per kind the median and max
time from the fault and from its healing to the next acknowledged append, and the longest stretch without one
(tests/chaos/timing.py). A run with a violation, or one that stalled, keeps its directory (ZooKeeper's and every
process's logs and data, history.jsonl: every submission and its outcome, faults.jsonl, summary.txt) and names it;
a clean run removes it unless --keep. The servers' ZooKeeper sessions are 4 s (tests/chaos/cluster.py): a ZooKeeper
kill -9 or SIGSTOP held 1-8 s ends within or past them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.chaos.cluster import PARTITIONS, healthy_owners
from tests.chaos.load_history import LoadProcesses, check_load_run
from tests.chaos.test_faults import report
from tests.chaos.test_zookeeper_faults import on_own_zookeeper
from tests.chaos.timed import timed_fault
from tests.chaos.timing import Recovery, table
from waltz_common.testing.local_cluster import LocalCluster, ManagedProcess
from waltz_common.testing.zookeeper import ZooKeeperProcess

PROCESSES = 3
SUBMITTERS = 20
PACE_S = 0.5  # each submitter's pause between appends: at most 120 appends/s, a log the final check reads in minutes
STEADY = 20  # acknowledged appends after each healing before the next fault
RECOVERY_TIMEOUT_S = 120.0  # healthy and acknowledging again after a healing, or the run has stalled


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    inflict: Callable[[], object]
    heal: Callable[[], object]
    hold_s: float


def _signal(process: ManagedProcess, sig: int) -> Callable[[], None]:
    def send() -> None:
        assert process.process is not None, f"{process.name} is not running"
        process.process.send_signal(sig)

    return send


def choose(rng: random.Random, zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> Fault:
    """One fault at random, evenly over the kinds; its target and hold time at random too."""
    node = rng.choice(cluster.storage)
    server = rng.choice(cluster.servers)
    storage_link, client_link, zookeeper_link = node.proxy, server.proxy, server.zookeeper_proxy
    assert storage_link is not None and client_link is not None and zookeeper_link is not None, "not proxied"
    hold = rng.uniform
    faults = [
        Fault("storage kill -9", node.name, node.kill, node.start, hold(0.5, 6)),
        Fault("storage SIGSTOP", node.name, _signal(node, signal.SIGSTOP), _signal(node, signal.SIGCONT), hold(1, 8)),
        Fault("server kill -9", server.name, server.kill, server.start, hold(0.5, 6)),
        Fault("server SIGTERM", server.name, server.stop, server.start, hold(0.5, 4)),
        Fault(
            "server SIGSTOP", server.name, _signal(server, signal.SIGSTOP), _signal(server, signal.SIGCONT), hold(1, 8)
        ),
        Fault("zookeeper kill -9", "zookeeper", zookeeper.kill, zookeeper.start, hold(1, 8)),
        Fault("zookeeper SIGSTOP", "zookeeper", zookeeper.pause, zookeeper.resume, hold(1, 8)),
        Fault("rolling restart", "every process", lambda: rolling_restart(zookeeper, cluster), lambda: None, 0.0),
        Fault("storage link cut", node.name, storage_link.cut, storage_link.heal, hold(0.5, 6)),
        Fault("storage link blackhole", node.name, storage_link.blackhole, storage_link.heal, hold(1, 8)),
        Fault("storage link delay", node.name, lambda: storage_link.delay(0.1), storage_link.heal, hold(2, 8)),
        Fault("client link cut", server.name, client_link.cut, client_link.heal, hold(0.5, 6)),
        Fault("client link blackhole", server.name, client_link.blackhole, client_link.heal, hold(1, 8)),
        Fault("zookeeper link blackhole", server.name, zookeeper_link.blackhole, zookeeper_link.heal, hold(1, 8)),
    ]
    return rng.choice(faults)


def rolling_restart(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
    """Each storage node, then each server, then ZooKeeper: SIGTERM and a start on the same data, one at a time,
    each once the one before is back (a deployment's rolling restart)."""
    for process in [*cluster.storage, *cluster.servers]:
        process.stop()
        process.start()
    zookeeper.stop()
    zookeeper.start()


@dataclass
class Outcome:
    seed: int
    seconds: float = 0.0
    submitted: int = 0
    acknowledged: int = 0
    resent: int = 0  # submissions executed more than once (an attempt proven failed)
    failed: int = 0  # submissions reported failed (every attempt proven failed: client.maxRetries lock failures)
    faults: list[dict[str, object]] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        done = Counter(r.kind for r in self.recoveries)
        lines = [
            f"soak: {self.seconds / 60:.1f} min, seed {self.seed}; {self.acknowledged} appends acknowledged of "
            f"{self.submitted} submitted ({self.failed} reported failed, {self.resent} executed again); "
            f"{len(self.recoveries)} faults: "
            + ", ".join(f"{kind} {n}" for kind, n in sorted(done.items())),
            "recovery (seconds to the next acknowledged append; gap: the longest stretch without one):",
            *table(self.recoveries),
            f"violations: {len(self.violations)}",
            *(f"  {v}" for v in self.violations),
        ]
        return lines


async def soak(
    zookeeper: ZooKeeperProcess, cluster: LocalCluster, directory: Path, seconds: float, rng: random.Random,
    outcome: Outcome,
) -> list[dict[str, object]]:
    """Faults at random for `seconds` under load; every submission's record (violations go into outcome)."""
    started = time.monotonic()
    await healthy_owners(cluster)
    config = {**cluster.client_config(), "client.maxConcurrentTransactions": 100}
    load = LoadProcesses(directory / "load", config, PROCESSES, SUBMITTERS, ("--pace", str(PACE_S)))
    try:
        await load.each_acknowledged("before the first fault", timeout=RECOVERY_TIMEOUT_S)
        await load.acknowledged_at_least(STEADY, "before the first fault", timeout=RECOVERY_TIMEOUT_S)
        try:
            while time.monotonic() - started < seconds:
                await through(cluster, load, choose(rng, zookeeper, cluster), outcome)
                await asyncio.sleep(rng.uniform(0.5, 3))
        except AssertionError as exc:  # stalled: no recovery in time
            outcome.violations.append(f"stalled: {exc}")
        outcome.seconds = time.monotonic() - started
        await asyncio.to_thread(heal_everything, zookeeper, cluster)
        submissions = await load.stop(timeout=300)
    finally:
        load.kill()
    outcome.submitted = len(submissions)
    outcome.acknowledged = sum(1 for s in submissions if s["outcome"] == "committed")
    return submissions


async def through(cluster: LocalCluster, load: LoadProcesses, fault: Fault, outcome: Outcome) -> None:
    """Inflict, hold, heal; wait for healthy owners and STEADY acknowledgements; record the recovery."""
    found, _ = await timed_fault(
        load,
        fault.kind,
        fault.inflict,
        fault.heal,
        fault.hold_s,
        STEADY,
        settle=lambda: healthy_owners(cluster, RECOVERY_TIMEOUT_S),
        timeout=RECOVERY_TIMEOUT_S,
        partitions=PARTITIONS,
    )
    outcome.recoveries.append(found)
    # the wall clock of the fault, to find it in the processes' logs
    at = time.strftime("%H:%M:%S", time.gmtime(time.time() - (time.monotonic() - found.fault_at)))
    outcome.faults.append({"kind": fault.kind, "target": fault.target, "utc": at, **asdict(found)})
    report("soak", f"{at} UTC {fault.kind} of {fault.target}: {found.describe()}; {load.acknowledged} acknowledged")


def heal_everything(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
    """What a fault interrupted half way may have left: every link mended, every process running."""
    for proxy in cluster.proxies():
        proxy.heal()
    if zookeeper.pid is None:
        zookeeper.start()
    else:
        zookeeper.resume()
    for process in [*cluster.storage, *cluster.servers]:
        if process.running:
            assert process.process is not None
            process.process.send_signal(signal.SIGCONT)
        else:
            process.start()


def run_soak(directory: Path, seconds: float, seed: int) -> Outcome:
    """A whole soak in directory (ZooKeeper and the cluster under it); the outcome, violations included."""
    rng = random.Random(seed)
    outcome = Outcome(seed)

    async def scenario(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
        submissions: list[dict[str, object]] | None = None
        try:
            submissions = await soak(zookeeper, cluster, directory, seconds, rng, outcome)
        finally:
            await asyncio.to_thread(heal_everything, zookeeper, cluster)
        if submissions is not None:
            keep_history(directory, submissions)
            try:
                verdict = await check_load_run(cluster, submissions, "soak", read_timeout=max(600.0, seconds))
                outcome.resent = verdict.resent
                outcome.failed = verdict.failed
            except AssertionError as exc:
                found = exc.args[0] if exc.args else "the history check failed"
                outcome.violations.extend(str(p) for p in (found if isinstance(found, list) else [found]))

    try:
        on_own_zookeeper(directory, scenario, proxied=True, deadline=seconds + 1200)
    except Exception as exc:  # the run itself broke (a process would not start, the deadline passed)
        outcome.violations.append(f"the run broke: {exc!r}")
    (directory / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in outcome.faults))
    (directory / "summary.txt").write_text("\n".join(outcome.summary()) + "\n")
    return outcome


def keep_history(directory: Path, submissions: list[dict[str, object]]) -> None:
    with (directory / "history.jsonl").open("w") as out:
        for submission in submissions:
            out.write(json.dumps(submission) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long faults go on (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="the random seed (default: from the clock)")
    parser.add_argument("--dir", type=Path, default=None, help="where the run lives (default: a new /tmp/waltz-soak-*)")
    parser.add_argument("--keep", action="store_true", help="keep the directory of a clean run too")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time())
    directory = args.dir or Path(tempfile.mkdtemp(prefix="waltz-soak-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.minutes:g} min, seed {seed}, in {directory}", flush=True)
    outcome = run_soak(directory, args.minutes * 60, seed)
    print("\n".join(outcome.summary()), flush=True)
    if outcome.violations:
        print(f"soak: FAILED; history, faults and every process's logs kept in {directory}", flush=True)
        return 1
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
