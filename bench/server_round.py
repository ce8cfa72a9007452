"""The server's Python calls per round in a cluster, its code against a baseline revision's in the same run.

    python -m bench.server_round [--baseline REV] [--rounds N] [--writers W] [--seconds S] [--top N]

A LocalCluster (ZooKeeper, 3 storage nodes, 1 server, 1 partition, 512 B transactions) whose server runs the baseline
revision's server package or this checkout's (as bench.storage_nodes --package server does), a closed loop of
--writers writers (bench.append_bench's closed_loop), and cProfile in the server's main thread for --seconds in the
middle of the loop (started and stopped by signals, through a sitecustomize module this benchmark puts first on the
server's PYTHONPATH). A round is one store batch (WriteSet.send); the table gives the Python calls per round, a count
that a busy machine does not change as long as the rounds run at a similar rate (what runs per second, timers and
pings, is spread over the rounds). --top prints the functions called most per round of the last candidate run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pstats
import signal
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
'''


def rounds_of(stats: pstats.Stats) -> int:
    """Store batches sent in the profile: the calls of WriteSet.send (Member.send runs once per replica)."""
    sends = [v[1] for k, v in stats.stats.items() if k[0].endswith("write_set.py") and k[2] == "send"]  # type: ignore[attr-defined]
    if not sends:
        raise RuntimeError("no store batch was sent while the server was profiled")
    return min(sends)


def one_cluster(workdir: Path, zookeeper: str, root: str, paths: list[Path], writers: int, seconds: float,
                sampler: MemorySampler) -> tuple[float, pstats.Stats]:
    """(committed/s, the server's profile) of one cluster whose processes start with paths first on PYTHONPATH."""
    out = workdir / "server.prof"
    os.environ[PROFILE_ENV] = str(out)
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
                time.sleep(seconds)
                os.kill(pid, signal.SIGUSR2)

            timer = threading.Thread(target=profile_window, daemon=True)
            timer.start()
            run_s = warmup + seconds + 2.0
            row = closed_loop(cluster, writers, 1, run_s, Scale(0, warmup, run_s, run_s, 0.0, 0, 0, 0, 0), sampler)
            timer.join()
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        os.environ.pop(PROFILE_ENV, None)
    return row.rate, pstats.Stats(str(out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=1, help="clusters per side (alternating which goes first)")
    parser.add_argument("--seconds", type=float, default=6.0, help="profiled seconds of each closed loop")
    parser.add_argument("--writers", type=int, default=1, help="writers of the closed loop")
    parser.add_argument("--top", type=int, default=0, help="print the N functions called most per round")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    revision = args.baseline or default_baseline()
    commit, tree = export(revision, "services/server", "server-round")
    print(f"server of {revision} = {commit[:12]} (baseline) and of this checkout (candidate), {args.writers} writers, "
          f"{args.seconds:g} s profiled of each closed loop")
    print(f"{'round':<6} {'revision':<10} {'load':>5} {'committed/s':>12} {'rounds':>7} {'calls/round':>12}")
    totals: dict[str, list[float]] = {"baseline": [], "candidate": []}
    last: pstats.Stats | None = None
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
                rate, stats = one_cluster(Path(workdir) / f"cluster-{n}", zookeeper.connect_string,
                                          f"/bench/round{n}", paths, args.writers, args.seconds, sampler)
                rounds = rounds_of(stats)
                calls = stats.total_calls / rounds  # type: ignore[attr-defined]
                totals[name].append(calls)
                if name == "candidate":
                    last = stats
                print(f"{r + 1:<6} {name:<10} {load:>5.2f} {rate:>12,.0f} {rounds:>7,} {calls:>12.1f}", flush=True)
    means = {name: sum(v) / len(v) for name, v in totals.items()}
    print(f"mean calls per round: baseline {means['baseline']:.1f}, candidate {means['candidate']:.1f}, "
          f"ratio {means['candidate'] / means['baseline']:.2f} (candidate / baseline)")
    if args.top and last is not None:
        rounds = rounds_of(last)
        rows = sorted(last.stats.items(), key=lambda kv: -kv[1][1])[: args.top]  # type: ignore[attr-defined]
        print(f"{'calls/round':>11}  function (candidate)")
        for (filename, line, function), (_, calls, *_rest) in rows:
            print(f"{calls / rounds:>11.2f}  {Path(filename).name}:{line}({function})")


if __name__ == "__main__":
    main()
