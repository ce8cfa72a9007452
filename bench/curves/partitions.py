"""Throughput against partitions and servers: 100 closed-loop writers spread over 1, 4 and 16 partitions,
owned by 1 or 2 servers.

    .venv/bin/python -m bench.curves.partitions [--quick]

Each configuration is a fresh LocalCluster (3 storage replicas) in the same ZooKeeper; one client process
runs the 100 writers (AsyncWaltzClient, callbacks on its loop), writer i appending to partition i mod P,
each waiting for its commit. Printed: committed appends/s in all, the ratio to the baseline (1 partition on
1 server, the first row of the same run), the slowest partition's rate as a share of the mean, and CPU per
append (servers, storage nodes, the client).
"""

from __future__ import annotations

from pathlib import Path

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Job, run_clients
from bench.baselines import MemorySampler, percentile
from bench.curves.common import CpuWindow, LoadLog, main_for, table, verdict, wait_owned
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

SHAPES = ((1, 1), (4, 1), (16, 1), (1, 2), (4, 2), (16, 2))  # (partitions, servers); the first is the baseline
WRITERS = 100
TARGET_RATIO = 1.3  # 4 partitions over 2 servers against 1 partition on 1 server (issue 20)


def run(workdir: Path, quick: bool) -> str:
    warmup, seconds = (0.5, 2.5) if quick else (2.0, 10.0)
    load = LoadLog()
    rows: list[list[object]] = []
    baseline = 0.0
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, MemorySampler() as sampler:
        load.mark("start")
        for partitions, servers in SHAPES:
            name = f"p{partitions}s{servers}"
            with LocalCluster(workdir / name, servers=servers, partitions=partitions,
                              zookeeper=zookeeper.connect_string, cluster_root=f"/bench/{name}") as cluster:
                wait_owned(cluster, partitions)
                config = cluster.client_config(**WRITER_CLIENT)
                job = Job(config, -1, writers=WRITERS, warmup_s=warmup, run_s=seconds,
                          partitions=tuple(range(partitions)))
                window = CpuWindow(cluster.pids(), warmup, seconds)
                (result,) = run_clients([job], sampler, window)
            rate = result.committed / seconds
            baseline = baseline or rate
            mean = result.committed / partitions
            slowest = min(result.by_partition.values()) / mean if mean else 0.0
            per = 1e6 / max(result.committed, 1)  # microseconds per append
            ratio = rate / baseline
            target = ""
            if (partitions, servers) == (4, 2):
                target = f">= {TARGET_RATIO}x: {verdict(ratio >= TARGET_RATIO)}"
            plural = 's' if partitions > 1 else ''
            label = f"{partitions} partition{plural}, {servers} server{'s' if servers > 1 else ''}"
            rows.append([label, rate, ratio,
                         slowest, percentile(list(result.latencies), 0.99) * 1e3, window.of("server") * per,
                         window.of("storage") * per, result.cpu_s * per, result.errors, target])
            load.mark(name)
    head = ["", "appends/s", "x baseline", "slowest share", "p99 ms", "server us/append", "storage us/append",
            "client us/append", "errors", "target"]
    return "\n".join([
        load.line(), "",
        f"{WRITERS} closed-loop writers, 512 B, {seconds:g} s after {warmup:g} s warmup, 3 storage replicas; "
        "baseline: the first row (1 partition, 1 server)",
        table(head, rows),
        "slowest share: the slowest partition's committed appends / the mean per partition. "
        "us/append: CPU microseconds per committed append, all servers (all 3 storage nodes) summed.",
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
