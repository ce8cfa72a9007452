"""The feed row of bench.append_bench on its own, with each process's CPU per entry: where a catch-up feed's cost is.

    python -m bench.feed_row [--prefill N] [--rounds N]

A LocalCluster of this checkout (ZooKeeper, 3 storage nodes, 1 server, 1 partition) is filled with --prefill 512 B
transactions (AppendBatches of 1000 over a raw stream, as append_bench's prefill; the server caches the newest
server.feedCacheSize, 100,000 by default, so a larger log has its oldest part read from storage). Then, each round,
the whole log from transaction 0 goes to one consumer twice: a raw Stream (mount at -1, counting FeedData: the
server's side alone, the baseline of the same round) and an AsyncWaltzClient applying every transaction (append_bench's
client_feed). For each it prints entries/s and the CPU per entry of the server, the storage nodes (summed) and the
consumer's process (the client's from the mount to its last apply: its start-up left out). The best of the rounds
for rates, the least CPU per entry; the ratios are AsyncWaltzClient / raw Stream. CPU per entry is the figure a busy
machine disturbs least.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import psutil

from bench.append_bench import client_feed
from bench.raw_client import high_water_mark, raw_stream
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill", type=int, default=150_000, help="transactions in the log (append_bench --quick's)")
    parser.add_argument("--rounds", type=int, default=3, help="feeds of each kind")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="waltz-feed-row-"))
    rows: dict[str, list[tuple[float, dict[str, float]]]] = {"raw Stream": [], "AsyncWaltzClient": []}
    with ZooKeeperProcess(work / "zookeeper") as zookeeper, LocalCluster(
            work / "cluster", storage_nodes=3, servers=1, partitions=1, zookeeper=zookeeper.connect_string,
            cluster_root="/bench/feed") as cluster:
        processes = {name: psutil.Process(pid) for name, pid in cluster.pids().items() if name != "zookeeper"}

        def cpu() -> dict[str, float]:
            times = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
            return {"server": sum(t for n, t in times.items() if n.startswith("server")),
                    "storage": sum(t for n, t in times.items() if n.startswith("storage"))}

        asyncio.run(raw_stream(cluster, -1, args.prefill, 0))
        last = asyncio.run(high_water_mark(cluster.servers[0].address))
        for _ in range(args.rounds):
            before, own = cpu(), time.process_time()
            seconds, seen = asyncio.run(raw_stream(cluster, -1, 0, last))
            after, own = cpu(), time.process_time() - own
            rows["raw Stream"].append((seen / seconds, {**{k: (after[k] - before[k]) / seen for k in after},
                                                       "consumer": own / seen}))
            before = cpu()
            cpu_seconds: list[float] = []
            seconds = asyncio.run(client_feed(cluster, last, cpu_seconds))
            own = cpu_seconds[0]
            after = cpu()
            rows["AsyncWaltzClient"].append(((last + 1) / seconds, {
                **{k: (after[k] - before[k]) / (last + 1) for k in after}, "consumer": own / (last + 1)}))
    print(f"feed from 0 of {last + 1:,} transactions (the server caches the newest 100,000), {args.rounds} rounds: "
          f"best rate, least CPU; load average {os.getloadavg()[0]:.2f}")
    print(f"{'consumer':<18} {'entries/s':>10} {'server us':>10} {'storage us':>11} {'consumer us':>12}"
          "  (CPU per entry)")
    best = {}
    for name, results in rows.items():
        rate = max(r for r, _ in results)
        least = {k: min(c[k] for _, c in results) * 1e6 for k in ("server", "storage", "consumer")}
        best[name] = (rate, least)
        print(f"{name:<18} {rate:>10,.0f} {least['server']:>10.2f} {least['storage']:>11.2f} "
              f"{least['consumer']:>12.2f}")
    (raw_rate, raw_cpu), (rate, client_cpu) = best["raw Stream"], best["AsyncWaltzClient"]
    ratios = [f"{client_cpu[k] / raw_cpu[k]:.2f}" if raw_cpu[k] else "-" for k in ("server", "storage", "consumer")]
    print(f"{'ratio':<18} {rate / raw_rate:>10.2f} {ratios[0]:>10} {ratios[1]:>11} {ratios[2]:>12}"
          "  (AsyncWaltzClient / raw Stream)")


if __name__ == "__main__":
    main()
