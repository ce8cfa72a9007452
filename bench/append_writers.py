"""Writer processes of the append benchmark: each runs one AsyncWaltzClient in a closed or open loop."""

from __future__ import annotations

import array
import asyncio
import logging
import multiprocessing as mp
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench.baselines import RECORD_BYTES, MemorySampler
from waltz_client import AsyncWaltzClient, Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_common import event_loop
from waltz_common.gctune import tune_for_service

PARTITION = 0


class CountingCallbacks(WaltzClientCallbacks):
    """Applies by remembering the high-water mark (the data is not fetched)."""

    def __init__(self, start: int) -> None:
        self.hwm = start  # of PARTITION (others in hwms)
        self.hwms: dict[int, int] = {}
        self.applied = 0
        self.on_apply: Callable[[int], None] = lambda _: None

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm if partition_id == PARTITION else self.hwms.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        if transaction.partition_id != PARTITION:
            self.hwms[transaction.partition_id] = transaction.transaction_id
            self.applied += 1
            return
        self.hwm = transaction.transaction_id
        self.applied += 1
        self.on_apply(self.hwm)


class Append(TransactionContext):
    def __init__(self, payload: bytes, partition: int = PARTITION) -> None:
        self.payload = payload
        self.partition = partition

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(self.payload)
        return True


@dataclass
class Job:
    config: dict[str, Any]
    start_hwm: int
    writers: int = 0  # closed loop
    rate: float = 0.0  # open loop (appends/s offered by this process)
    warmup_s: float = 0.0
    run_s: float = 0.0
    partitions: tuple[int, ...] = (PARTITION,)  # closed loop: writer i appends to partitions[i % len]


@dataclass
class JobResult:
    committed: int
    latencies: array.array[float]
    errors: int
    peak_rss: int
    submitted: int = 0
    cpu_s: float = 0.0  # CPU seconds of the process during the measured window
    by_partition: dict[int, int] = field(default_factory=dict)  # committed in the window, by partition


def _client_process(job: Job, conn: Connection) -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    result = event_loop.run(_client_job(job, conn))  # uvloop, as the services (an application's choice)
    result.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    conn.send(result)


async def _client_job(job: Job, conn: Connection) -> JobResult:
    callbacks = CountingCallbacks(job.start_hwm)
    by_partition = dict.fromkeys(job.partitions, 0)
    slots = max(job.writers, int(job.rate) + 1000 if job.rate else 0, 5)
    config = {**job.config, "client.maxConcurrentTransactions": slots, "client.autoMount": False}
    payload = os.urandom(RECORD_BYTES)
    latencies: array.array[float] = array.array("d")
    committed = errors = submitted = 0
    async with AsyncWaltzClient(callbacks, config) as client:
        for partition in job.partitions:  # the application holds everything so far
            if partition == PARTITION:
                callbacks.hwm = await client.high_water_mark(partition)
            else:
                callbacks.hwms[partition] = await client.high_water_mark(partition)
        client.mount_partitions(list(job.partitions))
        await client.wait_mounted()
        # An application with a busy client tunes the collector as the services do (the client library
        # leaves process-wide settings to the application): about 2 us per append here.
        tune_for_service()
        conn.send("ready")
        await asyncio.to_thread(conn.recv)
        begin = time.perf_counter() + job.warmup_s
        end = begin + job.run_s

        async def one(scheduled: float, partition: int = PARTITION) -> None:
            nonlocal committed, errors
            try:
                future = await client.submit(Append(payload, partition))
                await future
            except Exception:
                errors += 1
                return
            done = time.perf_counter()
            if scheduled >= begin:
                latencies.append(done - scheduled)
            if begin <= done < end:
                committed += 1
                by_partition[partition] += 1

        async def writer(partition: int) -> None:
            nonlocal submitted
            while (now := time.perf_counter()) < end:
                submitted += 1
                await one(now, partition)

        cpu: list[float] = []

        async def measure_cpu() -> None:
            for moment in (begin, end):
                await asyncio.sleep(max(0.0, moment - time.perf_counter()))
                cpu.append(time.process_time())

        cpu_task = asyncio.create_task(measure_cpu())
        if job.writers:
            parts = job.partitions
            await asyncio.gather(*(writer(parts[i % len(parts)]) for i in range(job.writers)))
        else:
            tasks = set()
            index = 0
            start = time.perf_counter()
            while (scheduled := start + index / job.rate) < end:
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one(scheduled))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                index += 1
            submitted = index
            await asyncio.gather(*tasks)
        await cpu_task
    return JobResult(committed, latencies, errors, 0, submitted, cpu[1] - cpu[0], by_partition)


def run_clients(jobs: list[Job], sampler: MemorySampler, during: Callable[[], None] | None = None) -> list[JobResult]:
    """Start one process per job, wait until each has mounted, start them together, collect results."""
    ctx = mp.get_context("spawn")
    pipes, processes = [], []
    for job in jobs:
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_client_process, args=(job, child), daemon=True)
        process.start()
        assert process.pid is not None
        sampler.watch("writer processes", process.pid)
        pipes.append(parent)
        processes.append(process)
    try:
        for pipe in pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a client process failed to start")
        for pipe in pipes:
            pipe.send("go")
        if during is not None:
            during()
        results = [pipe.recv() for pipe in pipes]
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
    return results


# ---------------------------------------------------------------------------------------- phases
