"""A client offered more than it can take: several processes, each an open loop past the cluster's capacity.

    .venv/bin/python -m bench.overload [--processes 3] [--factor 2] [--seconds 60] [--baseline REV]

One LocalCluster (3 storage replicas, 1 server, 1 partition). First the capacity, in the same run: a closed loop of
`--processes` client processes with client.maxConcurrentTransactions writers each (every slot busy, none waiting),
committed/s. Then each process is offered factor x capacity / processes submits per second for `--seconds`: every
`submit_and_wait` in its own task, started on a fixed schedule whatever happens to the earlier ones, with the
client's documented settings only (client.requestTimeout bounds a wait for a slot). Per process: offered and
committed/s (in the window), the wait from the scheduled time to the commit (p50, p99), the errors (time-outs that
name their setting, and any other), and FCFS: the most submits that arrived later and left the slot queue (handed a
slot, or timed out) before one that waited. A first-come, first-served queue keeps that near 0 (a later arrival
may go first only when it found a free slot and nobody waiting: at most the slots).

With --baseline REV (default: `git merge-base HEAD main`) the open loop also runs the client package of REV
(exported once, bench/package_baseline.py) against the same cluster and the same offered rate, alternating which
goes first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.package_baseline import REPO, default_baseline, export

PARTITION = 0
SLOTS = 20  # client.maxConcurrentTransactions' default
RECORD_BYTES = 512


# ---------------------------------------------------------------------------------------- analysis (pure)


def max_overtaken(left_order: list[int]) -> int:
    """left_order: the arrival indices (0..n-1) of the submits in the order they left the slot queue. The most
    later arrivals that left before any one submit (0 for first come, first served)."""
    size = len(left_order)
    tree = [0] * (size + 1)  # a Fenwick tree of the arrivals that left so far
    worst = 0
    for seen, arrival in enumerate(left_order):
        i, earlier = arrival + 1, 0
        while i > 0:
            earlier += tree[i]
            i -= i & -i
        worst = max(worst, seen - earlier)  # those seen before it that arrived after it
        i = arrival + 1
        while i <= size:
            tree[i] += 1
            i += i & -i
    return worst


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------------------------- the worker process


async def _work(job: dict[str, Any]) -> dict[str, Any]:
    from bench.append_writers import Append, CountingCallbacks
    from waltz_client import AsyncWaltzClient, WaltzTimeoutError
    from waltz_common.gctune import tune_for_service

    callbacks = CountingCallbacks(-1)
    payload = os.urandom(RECORD_BYTES)
    result: dict[str, Any] = {"package": str(Path(sys.modules["waltz_client"].__file__ or "").parent)}
    async with AsyncWaltzClient(callbacks, {**job["config"], "client.autoMount": False}) as client:
        callbacks.hwm = await client.high_water_mark(PARTITION)
        client.mount_partitions([PARTITION])
        await client.wait_mounted()
        tune_for_service()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        begin = time.perf_counter()
        end = begin + job["seconds"]
        committed = timeouts = 0
        others: list[str] = []
        waits: list[float] = []
        left_order: list[int] = []
        arrivals = 0
        behind = cpu = 0.0  # the most the open loop fell behind its schedule; the process's CPU seconds in it

        async def one(scheduled: float) -> None:
            nonlocal arrivals, committed, timeouts
            me, arrivals = arrivals, arrivals + 1  # (tasks run their first step in the order they were made)
            try:
                future = await client.submit(Append(payload))
            except Exception as exc:
                left_order.append(me)
                if isinstance(exc, WaltzTimeoutError) and "(client." in str(exc):
                    timeouts += 1
                else:
                    others.append(f"{type(exc).__name__}: {exc}")
                return
            left_order.append(me)
            try:
                await future
            except Exception as exc:
                others.append(f"{type(exc).__name__}: {exc}")
                return
            done = time.perf_counter()
            waits.append(done - scheduled)
            if done < end:
                committed += 1

        async def writer() -> None:
            nonlocal committed
            while (now := time.perf_counter()) < end:
                await client.submit_and_wait(Append(payload))
                waits.append(time.perf_counter() - now)
                committed += 1

        if job["writers"]:
            await asyncio.gather(*(writer() for _ in range(job["writers"])))
            offered = 0
        else:
            tasks = set()
            rate, index = job["rate"], 0
            cpu_start = time.process_time()
            while (scheduled := begin + index / rate) < end:
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                now = time.perf_counter()
                behind = max(behind, now - scheduled)
                while scheduled <= now and scheduled < end:  # every one due (behind schedule: many at once)
                    task = asyncio.create_task(one(scheduled))  # they call submit in this order
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    index += 1
                    scheduled = begin + index / rate
                await asyncio.sleep(0)
            offered = arrivals
            cpu = time.process_time() - cpu_start
            await asyncio.gather(*tasks)  # each commits or times out within client.requestTimeout
        stats = client.stats
        result.update(behind=behind, cpu=cpu, retries=stats.retries, failed_appends=stats.failed_appends,
                      mounts=getattr(client._partitions[PARTITION], "mounts", -1))
    result.update(offered=offered, committed=committed, seconds=job["seconds"], timeouts=timeouts,
                  errors=len(others), error_samples=sorted(set(others))[:3], p50=percentile(waits, 0.5),
                  p99=percentile(waits, 0.99), overtaken=max_overtaken(left_order))
    return result


class GcClock:
    """The seconds the cyclic garbage collector ran, and how many full (generation 2) collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info["generation"] == 2


def _worker() -> None:
    from waltz_common import event_loop

    job = json.loads(sys.stdin.readline())
    clock = GcClock()
    result = event_loop.run(_work(job))
    result.update(gc_s=clock.seconds, gc_full=clock.full)
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class Load:
    processes: int
    seconds: float
    config: dict[str, Any]
    rate: float = 0.0  # per process; 0: closed loop
    writers: int = 0


def run_load(load: Load, package_root: Path | None = None) -> list[dict[str, Any]]:
    """Start the worker processes (the client package under package_root first on PYTHONPATH; None: this
    checkout's), start them together once all are mounted, and collect each one's result."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if package_root is not None:
        env["PYTHONPATH"] = str(package_root)
    job = json.dumps({"config": load.config, "seconds": load.seconds, "rate": load.rate, "writers": load.writers})
    workers = [subprocess.Popen([sys.executable, "-m", "bench.overload", "--worker"], cwd=REPO, env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(load.processes)]
    try:
        for worker in workers:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(job + "\n")
            worker.stdin.flush()
        for worker in workers:
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError("a client process did not mount")
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        results = []
        for worker in workers:
            assert worker.stdout is not None
            line = worker.stdout.readline()
            if worker.wait(120) != 0 or not line:
                raise RuntimeError(f"a client process failed (exit status {worker.returncode})")
            results.append(json.loads(line))
        return results
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def capacity(config: dict[str, Any], processes: int, seconds: float) -> float:
    """Committed/s of a closed loop: every slot (client.maxConcurrentTransactions) of every process busy."""
    slots = int(config.get("client.maxConcurrentTransactions", SLOTS))
    results = run_load(Load(processes, seconds, config, writers=slots))
    return sum(r["committed"] for r in results) / seconds


def rows(name: str, results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for i, r in enumerate(results):
        lines.append(f"{name:<10} {i:>4} {r['offered'] / r['seconds']:>10,.0f} {r['committed'] / r['seconds']:>12,.0f} "
                     f"{r['p50'] * 1e3:>9.1f} {r['p99'] * 1e3:>9.1f} {r['timeouts']:>9,} {r['errors']:>7,} "
                     f"{r['overtaken']:>10,} {r['behind'] * 1e3:>9,.0f} {r['cpu'] / r['seconds']:>6.2f} "
                     f"{r['gc_s']:>6.2f} {r['gc_full']:>4}")
        lines.extend(f"{'':<16}error: {sample[:200]}" for sample in r["error_samples"])
    total = sum(r["committed"] for r in results) / results[0]["seconds"]
    lines.append(f"{name:<10} {'all':>4} {sum(r['offered'] for r in results) / results[0]['seconds']:>10,.0f} "
                 f"{total:>12,.0f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--factor", type=float, default=2.0, help="offered / capacity")
    parser.add_argument("--seconds", type=float, default=60.0, help="the open loop's length")
    parser.add_argument("--capacity-seconds", type=float, default=8.0, help="the closed loop's length")
    parser.add_argument("--slots", type=int, default=SLOTS, help="client.maxConcurrentTransactions")
    parser.add_argument("--request-timeout", type=float, default=None, help="client.requestTimeout (default: its "
                        "default, 30 s)")
    parser.add_argument("--baseline", default=None, help="also run this revision's client (default: none; 'main': "
                        "git merge-base HEAD main)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    from waltz_common.testing.local_cluster import LocalCluster
    from waltz_common.testing.zookeeper import ZooKeeperProcess

    baseline: tuple[str, Path] | None = None
    if args.baseline is not None:
        revision = default_baseline() if args.baseline == "main" else args.baseline
        commit, tree = export(revision, "clients/python", "overload")
        baseline = (f"{args.baseline} = {commit[:12]}", tree)
    with tempfile.TemporaryDirectory(prefix="waltz-overload-") as workdir, \
            ZooKeeperProcess(Path(workdir) / "zookeeper") as zookeeper, \
            LocalCluster(Path(workdir) / "cluster", zookeeper=zookeeper.connect_string,
                         cluster_root="/bench/overload") as cluster:
        config = cluster.client_config(**{"client.maxConcurrentTransactions": args.slots})
        if args.request_timeout is not None:
            config["client.requestTimeout"] = args.request_timeout
        cap = capacity(config, args.processes, args.capacity_seconds)
        rate = args.factor * cap / args.processes
        load = Load(args.processes, args.seconds, config, rate=rate)
        runs: list[tuple[str, list[dict[str, Any]]]] = []
        order = [("candidate", None)] if baseline is None else [("baseline", baseline[1]), ("candidate", None)]
        for name, root in order:
            runs.append((name, run_load(load, root)))
    print(f"capacity (closed loop, {args.processes} processes x {args.slots} writers, {args.capacity_seconds:g} s): "
          f"{cap:,.0f} committed/s; offered {args.factor:g} x that for {args.seconds:g} s "
          f"({rate:,.0f}/s per process), 512 B appends, client.requestTimeout "
          f"{config.get('client.requestTimeout', 30):g} s, client.maxConcurrentTransactions {args.slots}, other client "
          "settings their defaults")
    if baseline is not None:
        print(f"baseline {baseline[0]}; candidate = this checkout")
    print(f"{'client':<10} {'proc':>4} {'offered/s':>10} {'committed/s':>12} {'p50 ms':>9} {'p99 ms':>9} "
          f"{'time-outs':>9} {'errors':>7} {'overtaken':>10} {'behind ms':>9} {'CPU':>6} {'GC s':>6} {'full':>4}")
    for name, results in runs:
        print("\n".join(rows(name, results)))
    print("wait: scheduled time -> committed; time-outs: WaltzTimeoutError naming its setting; overtaken: the most "
          "later arrivals that left the slot queue before one submit; behind: the most the offering loop fell behind "
          "its schedule (its process too busy to offer on time); CPU: the process's CPU seconds per second; "
          "GC s: seconds in the cyclic garbage collector, full: its generation-2 collections (the whole run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
