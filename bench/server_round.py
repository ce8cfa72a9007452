"""The server's Python calls per round in a cluster, its code against a baseline revision's in the same run.

    python -m bench.server_round [--baseline REV] [--rounds N] [--writers W] [--seconds S] [--top N] [--hops N]
                                 [--strace]

A LocalCluster (ZooKeeper, 3 storage nodes, 1 server, 1 partition, 512 B transactions) whose server runs the baseline
revision's server package or this checkout's (as bench.storage_nodes --package server does), a closed loop of
--writers writers (bench.append_bench's closed_loop), and cProfile in the server's main thread for --seconds in the
middle of the loop (started and stopped by signals, through a sitecustomize module this benchmark puts first on the
server's PYTHONPATH). A round is one store batch (WriteSet.send); the table gives the Python calls per round, a count
that a busy machine does not change as long as the rounds run at a similar rate (what runs per second, timers and
pings, is spread over the rounds). --top prints the functions called most per round of the last candidate run.

--hops N runs the server on asyncio's own loop (WALTZ_EVENT_LOOP=asyncio; the storage nodes too) and counts, per
round, in the same window: loop iterations, task steps (by the task's coroutine), other loop callbacks (future
callbacks, call_soon) and timers (call_at/call_later) by function; the N most frequent of the last candidate run
are printed. --strace counts the server's system calls in the window (strace -c -f), per round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import pstats
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.append_bench import Scale, closed_loop
from bench.baselines import MemorySampler
from bench.package_baseline import default_baseline, export
from bench.raw_client import raw_stream
from bench.storage_nodes import first_on_pythonpath
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

PROFILE_ENV = "WALTZ_BENCH_SERVER_PROFILE"
HOPS_ENV = "WALTZ_BENCH_SERVER_HOPS"
SITECUSTOMIZE = f'''"""bench.server_round: cProfile in waltz-server's main thread, SIGUSR1 to SIGUSR2."""
import os
import sys

if os.environ.get("{PROFILE_ENV}") and sys.argv and sys.argv[0].endswith("waltz-server"):
    import cProfile
    import signal

    _profile = cProfile.Profile()

    def _stop(*_):
        _profile.disable()
        _profile.dump_stats(os.environ["{PROFILE_ENV}"])

    signal.signal(signal.SIGUSR1, lambda *_: _profile.enable())
    signal.signal(signal.SIGUSR2, _stop)

    if os.environ.get("{HOPS_ENV}"):
        import asyncio
        import asyncio.base_events
        import asyncio.events
        import collections
        import json

        _hops = collections.Counter()

        def _name(callback):
            return getattr(callback, "__qualname__", None) or type(callback).__name__

        _handle_run = asyncio.events.Handle._run

        def _counted_run(self):
            if _profile_on[0]:
                owner = getattr(self._callback, "__self__", None)
                if isinstance(owner, asyncio.Task):
                    _hops["task step: " + _name(owner.get_coro())] += 1
                else:
                    _hops["callback: " + _name(self._callback)] += 1
            return _handle_run(self)

        _call_at = asyncio.base_events.BaseEventLoop.call_at

        def _counted_call_at(self, when, callback, *args, **kwargs):
            if _profile_on[0]:
                _hops["timer: " + _name(callback)] += 1
            return _call_at(self, when, callback, *args, **kwargs)

        _run_once = asyncio.base_events.BaseEventLoop._run_once

        def _counted_run_once(self):
            if _profile_on[0]:
                _hops["loop iterations"] += 1
            return _run_once(self)

        asyncio.events.Handle._run = _counted_run
        asyncio.base_events.BaseEventLoop.call_at = _counted_call_at
        asyncio.base_events.BaseEventLoop._run_once = _counted_run_once
        _profile_on = [False]

        def _start_hops(*_):
            _profile_on[0] = True
            _profile.enable()

        def _stop_hops(*_):
            _profile_on[0] = False
            _stop()
            with open(os.environ["{PROFILE_ENV}"] + ".hops.json", "w") as f:
                json.dump(dict(_hops), f)

        signal.signal(signal.SIGUSR1, _start_hops)
        signal.signal(signal.SIGUSR2, _stop_hops)
'''


def rounds_of(stats: pstats.Stats) -> int:
    """Store batches sent in the profile: the calls of WriteSet.send (Member.send runs once per replica)."""
    sends = [v[1] for k, v in stats.stats.items() if k[0].endswith("write_set.py") and k[2] == "send"]  # type: ignore[attr-defined]
    if not sends:
        raise RuntimeError("no store batch was sent while the server was profiled")
    return min(sends)


@dataclasses.dataclass
class Window:
    """What one cluster's profiled window measured."""

    rate: float  # committed/s of the closed loop
    stats: pstats.Stats
    hops: dict[str, int]  # --hops: the counts of the window (else empty)
    syscalls: dict[str, int]  # --strace: calls by system call (else empty)


def strace_counts(path: Path) -> dict[str, int]:
    """strace -c's table: calls by system call."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts


def one_cluster(workdir: Path, zookeeper: str, root: str, paths: list[Path], writers: int, seconds: float,
                sampler: MemorySampler, hops: bool = False, trace: bool = False) -> Window:
    """What the server's window measured in one cluster whose processes start with paths first on PYTHONPATH."""
    out = workdir / "server.prof"
    os.environ[PROFILE_ENV] = str(out)
    if hops:
        os.environ[HOPS_ENV] = "1"
        os.environ["WALTZ_EVENT_LOOP"] = "asyncio"
    traced = workdir / "strace.txt"
    try:
        with contextlib.ExitStack() as stack:
            with first_on_pythonpath(Path(os.pathsep.join(str(p) for p in paths))):
                cluster = stack.enter_context(LocalCluster(workdir, storage_nodes=3, servers=1, partitions=1,
                                                           zookeeper=zookeeper, cluster_root=root))
            pid = cluster.pids()["server-0"]
            asyncio.run(raw_stream(cluster, -1, 2000, 0))
            warmup = 2.0

            def profile_window() -> None:
                time.sleep(warmup + 2.0)
                os.kill(pid, signal.SIGUSR1)
                if trace:  # the window's system calls (strace's own start and stop are a small part of it)
                    subprocess.run(["timeout", "-s", "INT", str(seconds), "strace", "-c", "-f", "-p", str(pid), "-o",
                                    str(traced)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                else:
                    time.sleep(seconds)
                os.kill(pid, signal.SIGUSR2)

            timer = threading.Thread(target=profile_window, daemon=True)
            timer.start()
            run_s = warmup + seconds + 2.0
            row = closed_loop(cluster, writers, 1, run_s, Scale(0, warmup, run_s, run_s, 0.0, 0, 0, 0, 0), sampler)
            timer.join()
            deadline = time.monotonic() + 30
            hops_file = Path(str(out) + ".hops.json")
            while not (out.exists() and (hops_file.exists() or not hops)) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        for name in (PROFILE_ENV, HOPS_ENV, "WALTZ_EVENT_LOOP"):
            os.environ.pop(name, None)
    return Window(row.rate, pstats.Stats(str(out)), json.loads(hops_file.read_text()) if hops else {},
                  strace_counts(traced) if trace else {})


def per_round(counts: dict[str, int], rounds: int, top: int, what: str) -> None:
    """Print the top counts per round, and their total."""
    print(f"{'per round':>11}  {what} (candidate; total {sum(counts.values()) / rounds:.1f} per round)")
    for name, count in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{count / rounds:>11.2f}  {name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=1, help="clusters per side (alternating which goes first)")
    parser.add_argument("--seconds", type=float, default=6.0, help="profiled seconds of each closed loop")
    parser.add_argument("--writers", type=int, default=1, help="writers of the closed loop")
    parser.add_argument("--top", type=int, default=0, help="print the N functions called most per round")
    parser.add_argument("--hops", type=int, default=0,
                        help="count loop iterations, task steps, callbacks and timers (asyncio's loop), print N")
    parser.add_argument("--strace", action="store_true", help="count the server's system calls (strace -c -f)")
    parser.add_argument("--dump", type=Path, default=None, help="write the last candidate profile there (pstats)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    revision = args.baseline or default_baseline()
    commit, tree = export(revision, "services/server", "server-round")
    print(f"server of {revision} = {commit[:12]} (baseline) and of this checkout (candidate), {args.writers} writers, "
          f"{args.seconds:g} s profiled of each closed loop")
    print(f"{'round':<6} {'revision':<10} {'load':>5} {'committed/s':>12} {'rounds':>7} {'calls/round':>12}")
    totals: dict[str, list[float]] = {"baseline": [], "candidate": []}
    last: Window | None = None
    with tempfile.TemporaryDirectory(prefix="waltz-server-round-") as workdir, \
            ZooKeeperProcess(Path(workdir) / "zookeeper") as zookeeper, MemorySampler() as sampler:
        site = Path(workdir) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        n = 0
        for r in range(args.rounds):
            for name in ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline"):
                n += 1
                load = os.getloadavg()[0]
                paths = [site, tree] if name == "baseline" else [site]
                window = one_cluster(Path(workdir) / f"cluster-{n}", zookeeper.connect_string,
                                     f"/bench/round{n}", paths, args.writers, args.seconds, sampler,
                                     bool(args.hops), args.strace)
                rounds = rounds_of(window.stats)
                calls = window.stats.total_calls / rounds  # type: ignore[attr-defined]
                totals[name].append(calls)
                if name == "candidate":
                    last = window
                extra = ""
                if window.hops:
                    steps = sum(v for k, v in window.hops.items() if k.startswith("task step"))
                    callbacks = sum(v for k, v in window.hops.items() if k.startswith("callback"))
                    timers = sum(v for k, v in window.hops.items() if k.startswith("timer"))
                    extra += (f"  iterations {window.hops.get('loop iterations', 0) / rounds:.2f}, task steps "
                              f"{steps / rounds:.2f}, callbacks {callbacks / rounds:.2f}, timers {timers / rounds:.2f}")
                if window.syscalls:
                    extra += f"  syscalls {sum(window.syscalls.values()) / rounds:.1f}"
                print(f"{r + 1:<6} {name:<10} {load:>5.2f} {window.rate:>12,.0f} {rounds:>7,} {calls:>12.1f}{extra}",
                      flush=True)
    means = {name: sum(v) / len(v) for name, v in totals.items()}
    print(f"mean calls per round: baseline {means['baseline']:.1f}, candidate {means['candidate']:.1f}, "
          f"ratio {means['candidate'] / means['baseline']:.2f} (candidate / baseline)")
    if args.dump is not None and last is not None:
        last.stats.dump_stats(args.dump)
    if last is not None and last.hops:
        per_round(last.hops, rounds_of(last.stats), args.hops, "loop iterations, task steps, callbacks, timers")
    if last is not None and last.syscalls:
        per_round(last.syscalls, rounds_of(last.stats), 20, "system calls, all threads")
    if args.top and last is not None:
        rounds = rounds_of(last.stats)
        rows = sorted(last.stats.stats.items(), key=lambda kv: -kv[1][1])[: args.top]  # type: ignore[attr-defined]
        print(f"{'calls/round':>11}  function (candidate)")
        for (filename, line, function), (_, calls, *_rest) in rows:
            print(f"{calls / rounds:>11.2f}  {Path(filename).name}:{line}({function})")


if __name__ == "__main__":
    main()
