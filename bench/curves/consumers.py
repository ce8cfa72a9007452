"""Feed fan-out: 1, 10 and 50 mounted clients reading the whole (cached) log at once.

    .venv/bin/python -m bench.curves.consumers [--quick]

One LocalCluster (3 storage replicas, 1 server, 1 partition) holding N transactions of 512 B, all within the
server's feed cache. K raw Stream consumers (each its own channel, mounted at -1, counting FeedData), spread
over two processes, start together and read until the last transaction. Printed: transactions delivered per
second in all (K x N over the slowest consumer's time), server CPU per delivered transaction, and the slowest
consumer's lag behind the fastest when that one finished. The baseline is the first row (one consumer) of
the same run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

from bench.curves.common import CpuMeter, LoadLog, fill, main_for, table, verdict, wait_owned
from bench.raw_client import _take_client_id
from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_common import event_loop
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

FAN_OUT = (1, 10, 50)
PROCESSES = 2
TARGET_10 = 300_000.0  # delivered/s in all to 10 consumers (issue 20)


async def _consume(channel: grpc.aio.Channel, client_id: int, generation: int, until: int, progress: list[int],
                   i: int) -> float:
    """Mount at -1 and read the feed until transaction `until`; returns the time.time() it got there."""
    req = common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=0, seq_num=0)
    mount = server_pb2.MountRequest(req_id=req, client_high_water_mark=-1, seq_num=1)
    call = server_pb2_grpc.WaltzServerStub(channel).Stream()
    await call.write(server_pb2.ClientMessage(mount=mount))
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("the server ended the stream")
        if response.WhichOneof("message") == "feed":
            last = response.feed.transactions[-1].transaction_id
            progress[i] = last
            if last >= until:
                call.cancel()
                return time.time()


def _consumer_process(address: str, ids: list[tuple[int, int]], until: int, conn: Connection) -> None:
    async def main() -> tuple[list[float], list[int]]:
        progress = [-1] * len(ids)
        channels = [grpc.aio.insecure_channel(address) for _ in ids]
        try:
            for channel in channels:  # connected before the start: the run measures the feed, not the dial
                await asyncio.wait_for(channel.channel_ready(), 30)
            conn.send("ready")
            await asyncio.to_thread(conn.recv)
            tasks = [asyncio.ensure_future(_consume(channels[i], c, g, until, progress, i))
                     for i, (c, g) in enumerate(ids)]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            at_first = list(progress)  # everyone's position when this process's fastest consumer finished
            return await asyncio.gather(*tasks), at_first
        finally:
            for channel in channels:
                await channel.close()

    conn.send(event_loop.run(main()))


def fan_out(cluster: LocalCluster, count: int, until: int) -> tuple[float, list[float], list[int], float]:
    """(start time, each consumer's finish time, positions at each process's first finish, server CPU s)."""
    ids = [_take_client_id(cluster, 0) for _ in range(count)]
    ctx = mp.get_context("spawn")
    procs = min(PROCESSES, count)
    pipes, processes = [], []
    for n in range(procs):
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_consumer_process, args=(cluster.servers[0].address, ids[n::procs], until, child),
                              daemon=True)
        process.start()
        pipes.append(parent)
        processes.append(process)
    try:
        for pipe in pipes:
            pipe.recv()
        meter = CpuMeter({"server": cluster.servers[0].pid or 0})
        started = time.time()
        for pipe in pipes:
            pipe.send("go")
        finishes: list[float] = []
        positions: list[int] = []
        for pipe in pipes:
            done, at_first = pipe.recv()
            finishes += done
            positions += at_first
        return started, finishes, positions, meter.used()["server"]
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()


def run(workdir: Path, quick: bool) -> str:
    log = 50_000 if quick else 100_000  # within server.feedCacheSize (100,000)
    load = LoadLog()
    rows: list[list[object]] = []
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper:
        load.mark("start")
        with LocalCluster(workdir / "cluster", zookeeper=zookeeper.connect_string,
                          cluster_root="/bench/consumers") as cluster:
            prefill = fill(cluster, wait_owned(cluster, 1)[0], 0, log)
            load.mark("filled")
            baseline = 0.0
            for count in FAN_OUT:
                started, finishes, positions, server_cpu = fan_out(cluster, count, log - 1)
                elapsed = max(finishes) - started
                delivered = count * log / elapsed
                baseline = baseline or delivered
                behind = (log - 1) - min(positions)
                target = f">= {TARGET_10:,.0f}/s: {verdict(delivered >= TARGET_10)}" if count == 10 else ""
                rows.append([f"{count} consumer{'s' if count > 1 else ''}", delivered, delivered / baseline,
                             f"{server_cpu * 1e6 / (count * log):.2f}", max(finishes) - min(finishes), behind, target])
                load.mark(f"{count} consumers")
    head = ["", "delivered/s in all", "x 1 consumer", "server CPU us/delivered", "slowest lag s",
            "slowest lag txns", "target"]
    return "\n".join([
        load.line(), "",
        f"the whole log of {log:,} transactions (512 B, in the feed cache; prefilled at {prefill:,.0f}/s) read by "
        f"K raw Stream consumers at once over {PROCESSES} processes; baseline: 1 consumer, same run",
        table(head, rows),
        "slowest lag: its finish after the fastest one's (s), and how many transactions it still had to read when "
        "the fastest consumer of its process finished.",
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
