"""Server memory against the number of partitions it owns, with the caches' budget (server.cacheBudgetBytes).

    .venv/bin/python -m bench.curves.memory [--quick]

Baselines from the same run: the RSS of a server owning no partition (the second server of a 2-server
cluster with one partition), and, for each shape, the growth of the same server with a 1 MiB budget over the
same appends (the churn: what the append path leaves in the allocator, the caches almost empty). Then one
partition, and 16 on one server, filled with three times the budget's worth of 512 B transactions in all:
the caches' growth (RSS filled minus RSS empty, minus the churn) must stay within the budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.curves.common import LoadLog, fill, main_for, metric, table, verdict, wait_owned
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_server.cache_budget import DATA_ENTRY_BYTES, FEED_ENTRY_BYTES

MIB = 2**20


def _rss(pid: int) -> int:
    time.sleep(1.0)  # the last feed messages and cache puts settle
    return int(psutil.Process(pid).memory_info().rss)


@dataclass
class Shape:
    empty: int  # RSS owning the partitions, before any append
    filled: int
    cache: float  # waltz_server_cache_bytes after the fill
    idle: int = 0  # RSS of a server owning no partition (2-server clusters only)


def measure(workdir: Path, zookeeper: str, partitions: int, budget: int, appends: int, name: str) -> Shape:
    servers = 2 if partitions == 1 else 1  # the second server of a 1-partition cluster owns nothing
    with LocalCluster(workdir / name, servers=servers, partitions=partitions, zookeeper=zookeeper,
                      cluster_root=f"/bench/{name}", server_overrides={"server.cacheBudgetBytes": budget}) as cluster:
        addresses = wait_owned(cluster, partitions)
        owner = next(s for s in cluster.servers if s.address == addresses[0])
        assert owner.pid is not None
        idle = 0
        for server in cluster.servers:
            if server is not owner and server.pid is not None:
                idle = _rss(server.pid)
        empty = _rss(owner.pid)
        for partition, address in addresses.items():
            fill(cluster, address, partition, appends // partitions)
        filled = _rss(owner.pid)
        cache = metric(f"http://127.0.0.1:{owner.metrics_port}/metrics", "waltz_server_cache_bytes")
    return Shape(empty, filled, cache, idle)


def run(workdir: Path, quick: bool) -> str:
    budget = (32 if quick else 64) * MIB
    appends = 3 * budget // (512 + DATA_ENTRY_BYTES + FEED_ENTRY_BYTES)
    load = LoadLog()
    rows: list[list[object]] = []
    idle = 0
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper:
        load.mark("start")
        for partitions in (1, 16):
            churn = measure(workdir, zookeeper.connect_string, partitions, MIB, appends, f"churn{partitions}")
            shape = measure(workdir, zookeeper.connect_string, partitions, budget, appends, f"mem{partitions}")
            idle = idle or churn.idle
            slack = churn.filled - churn.empty
            growth = shape.filled - shape.empty
            label = f"{partitions} partition{'s' if partitions > 1 else ''}"
            rows.append([label, shape.empty / MIB, shape.filled / MIB, growth / MIB, slack / MIB, shape.cache / MIB,
                         verdict(growth - slack <= budget)])
            load.mark(f"{label}")
        unbounded = measure(workdir, zookeeper.connect_string, 16, 2**40, appends, "unbounded16")
        growth = unbounded.filled - unbounded.empty
        rows.append(["16 partitions, no budget (as before)", unbounded.empty / MIB, unbounded.filled / MIB,
                     growth / MIB, slack / MIB, unbounded.cache / MIB,
                     "within" if growth - slack <= budget else "over (no budget)"])
        load.mark("16 partitions, no budget")
    lines = [load.line(), "",
             f"server RSS (MiB), server.cacheBudgetBytes = {budget // MIB} MiB, {appends:,} appends of 512 B spread "
             f"over the partitions (about 3x the budget); baseline: a server owning no partition, "
             f"{idle / MIB:.1f} MiB",
             table(["", "RSS empty", "RSS filled", "growth", "churn", "cache metric", "growth - churn <= budget"],
                   rows),
             "no budget: server.cacheBudgetBytes 1 TiB, each partition bounded only by its own caches' sizes "
             "(server.feedCacheSize, server.transactionDataCacheSize), as before the budget. "
             "churn: the growth of the same shape with a 1 MiB budget over the same appends (same run). "
             "cache metric: waltz_server_cache_bytes (feed + data, the budget's own estimate)."]
    return "\n".join(lines)


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
