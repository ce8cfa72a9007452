"""Latency against offered load: open-loop appends at 1,000 / 2,000 / 5,000 / 10,000 per second.

    .venv/bin/python -m bench.curves.offered_load [--quick]

One LocalCluster (3 storage replicas, 1 server, 1 partition), one client process (AsyncWaltzClient,
callbacks on its loop) submitting 512 B appends on a fixed schedule; latency counts from the scheduled
time, so a stall is not hidden. Baselines from the same run: a raw gRPC echo and the storage node alone,
one at a time (the floors of one hop and of one replica's durable append).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Job, run_clients
from bench.baselines import MemorySampler, percentile, run_baselines
from bench.curves.common import CpuWindow, LoadLog, main_for, table, verdict, wait_owned
from bench.raw_client import high_water_mark
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

RATES = (1000, 2000, 5000, 10000)
TARGET_P99_S = 0.010  # at 5,000/s offered (issue 20)


def run(workdir: Path, quick: bool) -> str:
    warmup, seconds = (0.5, 2.5) if quick else (2.0, 12.0)
    load = LoadLog()
    rows: list[list[object]] = []
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, MemorySampler() as sampler:
        load.mark("start")
        base = run_baselines(workdir, zookeeper.connect_string, sampler, echo_serial=500, echo_pipelined=2000,
                             storage_serial=500, storage_batches=50)
        echo_p50 = percentile(base.echo_latencies, 0.5)
        storage_p50 = percentile(base.storage_latencies, 0.5)
        with LocalCluster(workdir / "cluster", zookeeper=zookeeper.connect_string,
                          cluster_root="/bench/offered") as cluster:
            address = wait_owned(cluster, 1)[0]
            config = cluster.client_config(**WRITER_CLIENT)
            for rate in RATES:
                hwm = asyncio.run(high_water_mark(address))
                window = CpuWindow(cluster.pids(), warmup, seconds)
                job = Job(config, hwm, rate=float(rate), warmup_s=warmup, run_s=seconds)
                (result,) = run_clients([job], sampler, window)
                lat = list(result.latencies)
                p50, p99, p999 = (percentile(lat, q) for q in (0.5, 0.99, 0.999))
                per_1000 = 1000 / max(result.committed, 1)
                split = [result.cpu_s * per_1000, window.of("server") * per_1000, window.of("storage") * per_1000]
                cpu = (sum(window.cpu.values()) + result.cpu_s) * per_1000
                target = f"p99 <= 10 ms: {verdict(p99 <= TARGET_P99_S)}" if rate == 5000 else ""
                rows.append([f"{rate:,}/s offered", result.committed / seconds, p50 * 1e3, p99 * 1e3, p999 * 1e3,
                             p50 / storage_p50, result.errors, cpu, *split, target])
                load.mark(f"after {rate:,}/s")
    head = ["", "achieved/s", "p50 ms", "p99 ms", "p99.9 ms", "p50 / storage p50", "errors", "CPU s/1000",
            "client", "server", "3 storage", "target"]
    return "\n".join([
        load.line(), "",
        f"baselines (same run): raw gRPC echo p50 {echo_p50 * 1e3:.2f} ms; storage node alone, 1-record append "
        f"p50 {storage_p50 * 1e3:.2f} ms",
        f"open loop, 512 B appends, {seconds:g} s each after {warmup:g} s warmup "
        "(latency from the scheduled time; CPU: every process, per 1,000 committed, then the client's, the "
        "server's and the storage nodes')",
        table(head, rows),
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
