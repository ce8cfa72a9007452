"""Appends with and without mutual TLS in the same run: the append benchmark's closed loop on two clusters.

    .venv/bin/python -m bench.tls_bench [--quick] [--dir DIR]

Two LocalClusters one after the other (ZooKeeper, 3 storage nodes, 1 server, 1 partition, 512 B
transactions): plaintext, then mutual TLS on every channel (client<->server, server<->storage;
development certificates, ECDSA P-256). On each, N writers (1, 10, 100) submit one append through
AsyncWaltzClient and wait for its commit, again and again. Prints appends/s and p50/p99 commit latency
of both, and the TLS/plaintext ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path

import grpc

from bench.append_bench import FULL, QUICK, WRITERS, Scale, WriterRow, closed_loop
from bench.baselines import MemorySampler
from bench.raw_client import high_water_mark
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess


def wait_ready(cluster: LocalCluster, timeout_s: float = 120.0) -> None:
    """Until the partition answers its high-water mark (its first store session has recovered)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            asyncio.run(high_water_mark(cluster.servers[0].address, cluster.tls_files("application")))
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def measure(workdir: Path, scale: Scale) -> dict[bool, list[WriterRow]]:
    """tls -> one row per writer count."""
    rows: dict[bool, list[WriterRow]] = {}
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, MemorySampler() as sampler:
        for secure in (False, True):
            name = "tls" if secure else "plaintext"
            with LocalCluster(workdir / name, storage_nodes=3, servers=1, partitions=1, tls=secure,
                              zookeeper=zookeeper.connect_string, cluster_root=f"/bench/{name}") as cluster:
                wait_ready(cluster)
                rows[secure] = [closed_loop(cluster, n, 1, scale.run_s, scale, sampler) for n in WRITERS]
    return rows


def format_rows(rows: dict[bool, list[WriterRow]]) -> str:
    head = (f"{'':<12} {'plain /s':>10} {'TLS /s':>10} {'TLS/plain':>9} | {'plain p50':>9} {'TLS p50':>8} | "
            f"{'plain p99':>9} {'TLS p99':>8} {'TLS/plain':>9}")
    lines = ["committed appends, 512 B; latency in ms from submit to the commit seen by the writer", head,
             "-" * len(head)]
    for plain, secure in zip(rows[False], rows[True], strict=True):
        lines.append(
            f"{plain.label:<12} {plain.rate:>10,.0f} {secure.rate:>10,.0f} {secure.rate / plain.rate:>9.2f} | "
            f"{plain.p50 * 1000:>9.2f} {secure.p50 * 1000:>8.2f} | {plain.p99 * 1000:>9.2f} "
            f"{secure.p99 * 1000:>8.2f} {secure.p99 / plain.p99:>9.2f}"
        )
    errors = sum(r.errors for group in rows.values() for r in group)
    lines.append(f"errors: {errors}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.tls_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="waltz-tls-bench-", dir=args.dir) as workdir:
        print(format_rows(measure(Path(workdir), QUICK if args.quick else FULL)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
