"""bench.ingest_steady's continuous stream: appender processes at a fixed offered rate, the ingest query with a
processing-time trigger, and a watcher of the Parquet sink; the freshness of every transaction.

Each appender (`python -m bench.ingest_stream SPEC`, a process of its own so the load does not share a GIL with the
Spark driver) mounts one partition over a raw Stream, sends its share of the rate in AppendBatches every TICK
seconds (open loop: what is due by the clock, whatever the commits do) and records, per transaction id, the wall
time its commit showed in the feed (the acknowledgement). The watcher polls the sink's `_spark_metadata` log: a
batch's files are readable from the moment its log file exists (Spark renames it into place), so it stamps that
moment on every transaction id in the files the file adds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse
from urllib.request import url2pathname

import grpc
import psutil

from bench.curves.common import verdict
from bench.ingest_bench import REPO, _append, payload
from bench.ingest_tables import (
    Freshness,
    Key,
    batches,
    freshness,
    metadata_files,
    metadata_paths,
    partition_of,
    spread,
)
from bench.raw_client import high_water_mark, mount_stream, take_client_id
from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_common import event_loop

TICK = 0.01
T = TypeVar("T")
TARGET_P99_S = 2.0
DRAIN_S = 15.0  # how long an appender waits for its last commits after it stopped sending


async def _append_at_rate(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: zookeeper, root, address, partition, rate, seconds, start_at (wall clock)."""
    partition = spec["partition"]
    client_id, generation = take_client_id(spec["zookeeper"], spec["root"], partition)
    hwm = await high_water_mark(spec["address"], None, partition)

    def req(seq: int) -> common_pb2.ReqId:
        return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=partition, seq_num=seq)

    txns, commits, latencies = array("q"), array("d"), array("d")
    sent_at: dict[int, float] = {}
    async with grpc.aio.insecure_channel(spec["address"]) as channel:
        call = server_pb2_grpc.WaltzServerStub(channel).Stream()
        await mount_stream(call, server_pb2.MountRequest(req_id=req(0), client_high_water_mark=hwm, seq_num=1))
        sent = errors = 0

        async def read() -> None:
            nonlocal errors
            while (response := await call.read()) is not grpc.aio.EOF:
                kind = response.WhichOneof("message")
                if kind == "feed":
                    now_wall, now = time.time(), time.perf_counter()
                    for entry in response.feed.transactions:
                        if entry.req_id.client_id == client_id:
                            txns.append(entry.transaction_id)
                            commits.append(now_wall)
                            latencies.append(now - sent_at.pop(entry.req_id.seq_num))
                elif kind in ("append_rejected", "lock_failure"):
                    errors += 1
            raise RuntimeError(f"partition {partition}: the server ended the stream")

        reader = asyncio.create_task(read())
        await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < spec["seconds"] and not reader.done():
            due = int(spec["rate"] * elapsed) - sent
            if due > 0:
                now = time.perf_counter()
                batch = []
                for seq in range(sent + 1, sent + due + 1):
                    sent_at[seq] = now
                    batch.append(_append(req(seq), hwm, payload(partition, seq)))
                sent += due
                await call.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=batch)))
            await asyncio.sleep(TICK)
        deadline = time.perf_counter() + DRAIN_S
        while len(txns) < sent and time.perf_counter() < deadline and not reader.done():
            await asyncio.sleep(0.05)
        if reader.done():
            reader.result()  # the stream's end, raised
        reader.cancel()
        call.cancel()
    cpu = sum(psutil.Process().cpu_times()[:2])
    return {"partition": partition, "sent": sent, "errors": errors, "cpu": cpu, "txns": txns.tolist(),
            "commits": commits.tolist(), "latencies": latencies.tolist()}


class ProcessCpu:
    """CPU seconds of this process's tree, split: the cluster's processes (and theirs) and the rest, Spark's (this
    driver, the JVM, its Python workers). Per pid, so that a worker started in between counts from zero."""

    def __init__(self, cluster_pids: list[int]) -> None:
        self.cluster = {pid: psutil.Process(pid) for pid in cluster_pids}

    def sample(self) -> dict[int, tuple[bool, float]]:
        """pid -> (a cluster process, its CPU seconds and its reaped children's)."""
        cluster = {p.pid for root in self.cluster.values() for p in [root, *root.children(recursive=True)]}
        me = psutil.Process()
        found = {}
        for process in [me, *me.children(recursive=True)]:
            try:
                t = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            found[process.pid] = (process.pid in cluster, t.user + t.system + t.children_user + t.children_system)
        return found

    def measure(self, call: Callable[[], T]) -> tuple[T, float, float]:
        """(call's result, Spark's CPU seconds, the cluster's) while call runs."""
        before = self.sample()
        result = call()
        after = self.sample()
        used = {in_cluster: 0.0 for in_cluster in (False, True)}
        for pid, (in_cluster, seconds) in after.items():
            used[in_cluster] += seconds - before.get(pid, (in_cluster, 0.0))[1]
        return result, used[False], used[True]


@dataclass
class Appended:
    """What the appenders sent and when each transaction committed."""

    sent: int
    errors: int
    cpu: float  # the appender processes' CPU seconds
    commits: dict[Key, float]
    latencies: list[float]


def run_appenders(specs: list[dict[str, Any]], workdir: Path) -> Appended:
    """One process per spec, all started together; their results merged."""
    outputs = [workdir / f"appender-{n}.json" for n in range(len(specs))]
    processes = [
        subprocess.Popen([sys.executable, "-m", "bench.ingest_stream", json.dumps(spec), str(out)], cwd=REPO)
        for spec, out in zip(specs, outputs, strict=True)
    ]
    for process in processes:
        if process.wait() != 0:
            raise RuntimeError(f"an appender exited with {process.returncode}")
    merged = Appended(0, 0, 0.0, {}, [])
    for out in outputs:
        result = json.loads(out.read_text())
        merged.sent += result["sent"]
        merged.errors += result["errors"]
        merged.cpu += result["cpu"]
        merged.commits.update(((result["partition"], t), at) for t, at in zip(result["txns"], result["commits"],
                                                                                strict=True))
        merged.latencies += result["latencies"]
    return merged


class SinkWatcher:
    """Polls a Parquet sink's `_spark_metadata` every interval; the wall time each transaction became readable."""

    def __init__(self, output: Path, interval: float) -> None:
        self.log = output / "_spark_metadata"
        self.interval = interval
        self.visible: dict[Key, float] = {}
        self.cpu = 0.0  # CPU seconds of its polls (this process's, not Spark's)
        self._seen_logs: set[str] = set()
        self._seen_files: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sink-watcher", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            begin = time.thread_time()
            self.poll()
            self.cpu += time.thread_time() - begin

    def poll(self) -> None:
        import pyarrow.parquet as pq

        names = metadata_files(os.listdir(self.log)) if self.log.is_dir() else []
        for name in names:
            if name in self._seen_logs:
                continue
            stamp = time.time()  # readable from now: the log file is in place
            self._seen_logs.add(name)
            for path in metadata_paths((self.log / name).read_text()):
                if path in self._seen_files:
                    continue  # a compact file repeats the batches before it
                self._seen_files.add(path)
                partition = partition_of(path)
                local = url2pathname(urlparse(path).path)  # the log holds URIs: file:///..., percent-encoded
                for txn in pq.read_table(local, columns=["transaction_id"]).column(0).to_pylist():
                    self.visible[(partition, txn)] = stamp

    def __enter__(self) -> SinkWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class StreamResult:
    """The continuous stream's figures."""

    appended: Appended
    seconds: float
    fresh: Freshness
    ingested_per_s: float
    drain_s: float
    progress: list[dict[str, Any]]
    spark_cpu: float  # CPU seconds over the load and its drain
    cluster_cpu: float


@contextmanager
def running_query(spark: Any, zookeeper: str, root: str, output: Path, interval_s: float) -> Iterator[Any]:
    """The ingest job's continuous query from the latest offsets (none of the backlog), stopped on the way out."""
    from waltz_spark import ingest as job

    args = job.parse_args(["--zookeeper", zookeeper, "--root", root, "--output", str(output), "--continuous",
                           "--interval", f"{interval_s} seconds", "--starting-offsets", "latest"])
    query = job.start_query(spark, job.preflight(args), args)
    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None and query.isActive and time.monotonic() < deadline:
            time.sleep(0.1)  # its first trigger: the query is planned and running
        if query.exception() is not None:
            raise query.exception()
        yield query
    finally:
        query.stop()


def continuous(spark: Any, target: Any, owners: dict[int, str], cpu: ProcessCpu, options: Any,
               workdir: Path) -> StreamResult:
    """options: rate, appenders, seconds, interval, poll. Appenders take the partitions in turn."""
    output = workdir / "stream"
    per = options.rate / options.appenders
    pids = sorted(owners)
    with running_query(spark, target.zookeeper, target.root, output, options.interval) as query:
        with SinkWatcher(output, options.poll) as watcher:
            start_at = time.time() + 3.0  # the appenders import and mount first
            specs = [
                {"zookeeper": target.zookeeper, "root": target.root, "partition": pids[n % len(pids)],
                 "address": owners[pids[n % len(pids)]], "rate": per, "seconds": options.seconds, "start_at": start_at}
                for n in range(options.appenders)
            ]

            def load() -> Appended:
                appended = run_appenders(specs, workdir)
                deadline = time.monotonic() + 3 * options.interval + 10  # the last micro-batch lands
                while any(key not in watcher.visible for key in appended.commits) and time.monotonic() < deadline:
                    time.sleep(options.poll)
                return appended

            appended, spark_cpu, cluster_cpu = cpu.measure(load)
        progress = list(query.recentProgress)
    fresh = freshness(appended.commits, watcher.visible)
    landed = [watcher.visible[key] for key in appended.commits if key in watcher.visible]
    span = max(landed, default=0.0) - min(landed, default=0.0)
    drain = max(landed, default=start_at) - (start_at + options.seconds)
    # The appenders (reaped children) and the watcher thread ran in this process's tree: not Spark's.
    spark_cpu -= appended.cpu + watcher.cpu
    return StreamResult(appended, options.seconds, fresh, len(landed) / span if span > 0 else 0.0, drain,
                        [p for p in progress if p["numInputRows"]], spark_cpu, cluster_cpu)


def stream_rows(result: StreamResult, offered: float, interval: float) -> list[tuple[str, object]]:
    """The rows of the continuous stream's table."""
    done = batches(result.progress)
    landed, sent = result.fresh.landed, result.appended.sent
    lat50, lat99, _ = spread(result.appended.latencies)
    ms50, ms99, ms_max = spread([b.ms for b in done])
    return [
        ("offered appends/s", offered),
        ("committed appends/s", len(result.appended.commits) / result.seconds),
        ("append ack p50 / p99 ms", f"{lat50 * 1000:.1f} / {lat99 * 1000:.1f}"),
        ("append errors", result.appended.errors),
        ("ingested rows/s (landed / first landing to last)", result.ingested_per_s),
        ("last landing after the appends stopped, s", result.drain_s),
        ("freshness p50 s (commit -> readable in Parquet)", result.fresh.p50),
        ("freshness p99 s", result.fresh.p99),
        ("freshness max s", result.fresh.max),
        (f"issue 45's target, freshness p99 <= {TARGET_P99_S:g} s", verdict(result.fresh.p99 <= TARGET_P99_S)),
        ("committed but not landed at the end", result.fresh.missing),
        (f"micro-batches with rows (trigger {interval:g} s)", len(done)),
        ("micro-batch ms p50 / p99 / max", f"{ms50:,.0f} / {ms99:,.0f} / {ms_max:,.0f}"),
        ("rows per micro-batch p50", sorted(b.rows for b in done)[len(done) // 2] if done else 0),
        ("Spark CPU s per 100k rows landed", result.spark_cpu * 100_000 / landed if landed else float("nan")),
        ("cluster CPU s per 100k rows landed (appends, feeds, reads)",
         result.cluster_cpu * 100_000 / landed if landed else float("nan")),
        ("appender CPU s per 100k appends", result.appended.cpu * 100_000 / sent if sent else float("nan")),
    ]


def main() -> None:
    """An appender: `python -m bench.ingest_stream SPEC_JSON OUTPUT_FILE`."""
    spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    out.write_text(json.dumps(event_loop.run(_append_at_rate(spec))))


if __name__ == "__main__":
    main()
