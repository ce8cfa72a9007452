"""What client.maxConcurrentTransactions (appends in flight per partition) buys and costs, on a real local cluster.

    .venv/bin/python -m bench.inflight [--values 1,2,5,10,20,50] [--seconds 4] [--processes 2] [--submitters 48]
                                       [--keys 200]

Starts a LocalCluster (ZooKeeper, 3 storage nodes, 1 server, 1 partition). For each value of the key, --processes
client processes (one AsyncWaltzClient each, the value as its maxConcurrentTransactions) run --submitters tasks
each, every one submitting transactions back to back with submit_and_wait for --seconds, two workloads in turn:
- no locks: 100-byte appends (what pipelining buys: throughput);
- contended: each transaction takes a write lock on one of --keys keys picked at random, as an application that
  updates rows would (what it costs: an append sent while an earlier one on the same key, its own or another
  client's, is not applied yet fails its lock check and is executed again).
Prints per value and workload: committed transactions/s, lock failures per committed transaction, p50 and p99
of submit_and_wait, and the ratio of the throughput to the baseline: the value 5 (the original default) in the
same run. The clients' CPU seconds per 1,000 commits show the client's cost. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import multiprocessing as mp
import random
import resource
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

from bench.baselines import percentile
from waltz_client import (
    AsyncWaltzClient,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
)
from waltz_common.testing.local_cluster import LocalCluster

BASELINE = 5
PAYLOAD = b"x" * 100


class Counting(WaltzClientCallbacks):
    """Applies by moving the high-water mark (the data is not fetched)."""

    def __init__(self) -> None:
        self.hwm = -1

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm

    def apply_transaction(self, transaction: Transaction) -> None:
        self.hwm = transaction.transaction_id


class Write(TransactionContext):
    """An append, with a write lock on one of `keys` keys (none when keys is 0)."""

    def __init__(self, key: int | None) -> None:
        self.key = key

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(PAYLOAD)
        if self.key is not None:
            builder.set_write_locks([PartitionLocalLock("row", self.key)])
        return True


@dataclass
class Result:
    committed: int
    lock_failures: int
    latencies: list[float]
    cpu_s: float


async def _run(config: dict[str, Any], inflight: int, submitters: int, seconds: float, keys: int,
               ready: Connection, go: Event) -> Result:
    rng = random.Random()
    latencies: list[float] = []
    async with AsyncWaltzClient(Counting(), config,
                                overrides={"client.maxConcurrentTransactions": inflight}) as client:
        await client.wait_mounted()
        ready.send("mounted")
        await asyncio.to_thread(go.wait)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        committed_before, failures_before = client.stats.committed, client.stats.lock_failures
        cpu_before = _cpu()

        async def submitter() -> None:
            while loop.time() < deadline:
                started = loop.time()
                await client.submit_and_wait(Write(rng.randrange(keys) if keys else None))
                latencies.append(loop.time() - started)

        await asyncio.gather(*(submitter() for _ in range(submitters)))
        return Result(client.stats.committed - committed_before, client.stats.lock_failures - failures_before,
                      latencies, _cpu() - cpu_before)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker(config: dict[str, Any], inflight: int, submitters: int, seconds: float, keys: int,
            conn: Connection, go: Event) -> None:
    logging.basicConfig(level=logging.WARNING)
    conn.send(dataclasses.asdict(asyncio.run(_run(config, inflight, submitters, seconds, keys, conn, go))))


def measure(config: dict[str, Any], inflight: int, args: argparse.Namespace, keys: int) -> dict[str, float]:
    """One value, one workload: every process's results, summed."""
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    pipes, processes = [], []
    for _ in range(args.processes):
        mine, theirs = ctx.Pipe()
        process = ctx.Process(target=_worker, args=(config, inflight, args.submitters, args.seconds, keys, theirs, go))
        process.start()
        pipes.append(mine)
        processes.append(process)
    try:
        for pipe in pipes:
            if not pipe.poll(120) or pipe.recv() != "mounted":
                raise RuntimeError("a client process did not mount within 120 s")
        go.set()
        results: list[Result] = []
        for pipe in pipes:
            if not pipe.poll(args.seconds + 120):
                raise RuntimeError("a client process did not finish")
            results.append(Result(**pipe.recv()))  # a dict: __main__'s classes do not cross processes
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    committed = sum(r.committed for r in results)
    latencies = sorted(x for r in results for x in r.latencies)
    return {
        "tps": committed / args.seconds,
        "lock_failures": sum(r.lock_failures for r in results) / max(1, committed),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "cpu_ms_per_1000": sum(r.cpu_s for r in results) / max(1, committed) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", default="1,2,5,10,20,50", help="maxConcurrentTransactions values to compare")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per value and workload")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--submitters", type=int, default=48, help="submitting tasks per client process")
    parser.add_argument("--keys", type=int, default=200, help="lock keys of the contended workload")
    args = parser.parse_args()
    values = sorted({int(v) for v in args.values.split(",")} | {BASELINE})
    rows: list[tuple[int, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="waltz-inflight-") as workdir, \
            LocalCluster(workdir, storage_nodes=3, servers=1, partitions=1) as cluster:
        config = cluster.client_config()
        started = time.monotonic()
        for keys, workload in ((0, "no locks"), (args.keys, f"contended ({args.keys} keys)")):
            for value in values:
                rows.append((value, workload, measure(config, value, args, keys)))
        elapsed = time.monotonic() - started
    print(f"client.maxConcurrentTransactions: {args.processes} client processes x {args.submitters} submitters, "
          f"{args.seconds:g} s per row, 1 partition, 3 storage nodes ({elapsed:.0f} s in all)")
    print(f"{'in flight':>9}  {'workload':<22} {'txn/s':>8} {'x base':>7} {'lock fail/commit':>17} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'client CPU ms/1k':>17}")
    for value, workload, row in rows:
        base = next(r for v, w, r in rows if v == BASELINE and w == workload)
        mark = " (baseline)" if value == BASELINE else ""
        print(f"{value:>9}  {workload:<22} {row['tps']:>8,.0f} {row['tps'] / base['tps']:>7.2f} "
              f"{row['lock_failures']:>17.3f} {row['p50_ms']:>7.1f} {row['p99_ms']:>7.1f} "
              f"{row['cpu_ms_per_1000']:>17.0f}{mark}")


if __name__ == "__main__":
    main()
