"""Spark ingestion rows/s from a real local cluster into Parquet, next to baselines in the same run.

    .venv/bin/python -m bench.ingest_bench [--rows N] [--partitions P] [--dir DIR] [--reads-only | --conversions-only]

Starts a LocalCluster (ZooKeeper, 3 storage nodes, 1 server) and fills P partitions with N
transactions of about 100 B of JSON through raw client streams (large AppendBatches). Measures:
- the source's reads (read_task: ReadTransactions, every record checked, Arrow batches), no Spark (1 and 2
  readers): of Records (raw=false, the messages of a server before RecordRuns) and of RecordRuns (raw=true, the
  data files' bytes passed through), and the CPU seconds each process spends per 100k records on each read;
- with one `local[2]` Spark session: Spark writing N rows of the same shape from an in-memory
  DataFrame to Parquet (the ceiling); the ingest job's streaming query (availableNow) from the
  cluster to partitioned Parquet, raw and with the json_columns decoder; the same ingest from an
  in-memory fake server (the Spark side alone); batch reads yielding Arrow batches vs tuples;
- the Python worker's conversion of records, Arrow builder vs tuples through Spark's converter.
The ingest rows are the best of two runs, the batch reads of three. Prints a table; asserts nothing.
--reads-only stops after the raw reads (no Spark): the quick figure for work on the read path;
--conversions-only measures the worker rows alone (no cluster, a few seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from waltz.v1 import common_pb2, metadata_pb2, server_pb2, server_pb2_grpc
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import crc32
from waltz_spark.cluster import ClusterDirectory
from waltz_spark.reading import BatchBuilder, ReadTask, check, fetch, read_task
from waltz_spark.runs import RunBuilder
from waltz_spark.source import WaltzBatchReader, WaltzDataSource
from waltz_spark.testing import FakeWaltzServer, encode, local_spark, record, register, run_of

REPO = Path(__file__).resolve().parents[1]
APPEND_BATCH = 1000


def payload(partition: int, n: int) -> bytes:
    return json.dumps({"n": n, "partition": partition, "pad": "x" * 64}).encode()


def bulk_append(cluster: LocalCluster, partition: int, count: int) -> float:
    """Append count transactions to partition over one raw client stream; seconds until all are in the feed."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        counter = zk.Counter(cluster.paths.client_ids)
        counter += 1
        client_id = int(counter.post_value)
        assignment = zkmeta.require(zk, cluster.paths.server_assignment, metadata_pb2.ServerAssignment)[0]
        generation = next(o.generation for o in assignment.partitions if o.partition_id == partition)
    finally:
        zk.stop()
        zk.close()
    with ClusterDirectory(cluster.zookeeper, cluster.paths.root) as directory:
        address = directory.owner(partition)
        hwm = directory.high_water_marks([partition])[partition]

    def req(seq: int) -> common_pb2.ReqId:
        return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=partition, seq_num=seq)

    outbox: queue.Queue[server_pb2.ClientMessage | None] = queue.Queue()
    outbox.put(
        server_pb2.ClientMessage(mount=server_pb2.MountRequest(req_id=req(0), client_high_water_mark=hwm, seq_num=1))
    )

    def requests() -> Iterator[server_pb2.ClientMessage]:
        while (message := outbox.get()) is not None:
            yield message

    start = time.perf_counter()
    with grpc.insecure_channel(address) as channel:
        responses = server_pb2_grpc.WaltzServerStub(channel).Stream(requests())
        try:
            seen = 0
            for response in responses:
                kind = response.WhichOneof("message")
                if kind == "mount":
                    if response.mount.state != server_pb2.MountResponse.READY:
                        raise RuntimeError(f"mount of partition {partition}: {response.mount}")
                    for first in range(0, count, APPEND_BATCH):
                        batch = [
                            _append(req(first + i + 1), hwm, payload(partition, first + i))
                            for i in range(min(APPEND_BATCH, count - first))
                        ]
                        outbox.put(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=batch)))
                elif kind == "feed":
                    seen += sum(1 for t in response.feed.transactions if t.req_id.client_id == client_id)
                    if seen >= count:
                        return time.perf_counter() - start
                else:
                    raise RuntimeError(f"partition {partition}: unexpected answer {response}")
        finally:
            outbox.put(None)
            responses.cancel()
    raise RuntimeError(f"partition {partition}: the stream ended before the feed showed every append")


def _append(req_id: common_pb2.ReqId, hwm: int, data: bytes) -> server_pb2.AppendRequest:
    return server_pb2.AppendRequest(
        req_id=req_id, client_high_water_mark=hwm, data_length=len(data), data=data, checksum=crc32(data)
    )


@dataclass(frozen=True)
class Target:
    """A cluster to read: its ZooKeeper and root (the real one or the fake's)."""

    zookeeper: str
    root: str


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def raw_reads(target: Target, partitions: int, readers: int, runs: bool = False) -> float:
    """Seconds to read every partition, readers at a time, with read_task (checks + Arrow): RecordRuns when runs
    (ReadTransactions raw=true, RunBuilder), else Records (BatchBuilder), as a server before raw answers."""
    with ClusterDirectory(target.zookeeper, target.root) as directory:
        hwms = directory.high_water_marks(range(partitions))
        owners = directory.owners()
    tasks = [ReadTask(target.zookeeper, target.root, p, 0, hwms[p], owners[p], raw=runs) for p in range(partitions)]

    def drain(task: ReadTask) -> int:
        return sum(batch.num_rows for batch in read_task(task))

    with ThreadPoolExecutor(readers) as pool:
        return timed(lambda: list(pool.map(drain, tasks)))


def cpu_per_100k(cluster: LocalCluster, rows: int, call: Callable[[], Any]) -> str:
    """CPU seconds per 100k records that each process spends while call() runs."""
    processes = {name: psutil.Process(pid) for name, pid in cluster.pids().items()}
    processes["reader (this process)"] = psutil.Process()
    before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
    call()
    spent = {name: (sum(p.cpu_times()[:2]) - before[name]) * 100_000 / rows for name, p in processes.items()}
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(spent.items()) if seconds >= 0.01)


class TupleReader(WaltzBatchReader):
    """The source's batch reader yielding plain tuples instead of Arrow batches (the comparison)."""

    def read(self, partition: Any) -> Iterator[Any]:
        task = partition.value
        next_id = task.first
        for records in fetch(
            task.address, task.partition, task.first, task.last, task.batch_size, task.timeout_s, raw=False
        ):
            assert not isinstance(records, common_pb2.RecordRun)  # not raw: the tuples come from Records
            check(task.partition, next_id, records)
            next_id += len(records)
            for r in records:
                q = r.req_id
                yield (task.partition, r.transaction_id, r.header, q.client_id, q.generation, q.seq_num, r.data)


class TupleSource(WaltzDataSource):
    @classmethod
    def name(cls) -> str:
        return "waltz_tuples"

    def reader(self, schema: Any) -> Any:
        from waltz_spark.options import parse_options

        return TupleReader(parse_options(self.options))


def spark_session() -> Any:
    # Python workers import this module (TupleSource) by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    spark = local_spark("ingest-bench")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TupleSource)
    return spark


def in_memory_to_parquet(spark: Any, rows: int, partitions: int, out: Path) -> float:
    """The ceiling: the same number of rows of the same shape, made by Spark itself, to partitioned Parquet."""
    df = spark.range(rows).selectExpr(
        f"cast(id % {partitions} as int) as partition",
        "id as transaction_id",
        "cast(0 as int) as header",
        "cast(1 as int) as client_id",
        "cast(1 as int) as generation",
        "cast(id as int) as seq_num",
        """cast(concat('{"n": ', id, ', "pad": "', repeat('x', 64), '"}') as binary) as data""",
    )
    return timed(lambda: df.write.partitionBy("partition").parquet(str(out)))


def ingest(spark: Any, target: Target, out: Path, extra: list[str]) -> float:
    """The ingest job's streaming query (availableNow) from its start to its end (preflight excluded)."""
    from waltz_spark import ingest as job

    args = job.parse_args(["--zookeeper", target.zookeeper, "--root", target.root, "--output", str(out), *extra])
    plan = job.preflight(args)
    return timed(lambda: job.run(job.start_query(spark, plan, args)))


def best_ingest(spark: Any, target: Target, out: Path, extra: list[str]) -> float:
    return min(ingest(spark, target, out / f"run{n}", extra) for n in range(2))


def batch_to_parquet(spark: Any, target: Target, source: str, out: Path) -> float:
    df = spark.read.format(source).option("zookeeper", target.zookeeper).option("root", target.root).load()
    return timed(lambda: df.write.partitionBy("partition").parquet(str(out)))


def best_batches(spark: Any, target: Target, out: Path) -> tuple[float, float]:
    """Best of three batch reads to Parquet for Arrow batches and for tuples, alternating (the machine is noisy)."""
    arrow, tuples = [], []
    for n in range(3):
        arrow.append(batch_to_parquet(spark, target, "waltz", out / f"arrow{n}"))
        tuples.append(batch_to_parquet(spark, target, "waltz_tuples", out / f"tuples{n}"))
    return min(arrow), min(tuples)


def conversions(rows: int) -> list[tuple[str, float]]:
    """Seconds for the Python worker's share: records to Arrow, by the source's builders (from Records, from the
    same records as raw runs of 500, what ReadTransactions sends) and by Spark from tuples."""
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from waltz_spark.source import SCHEMA

    chunks = [[record(0, i + j, payload(0, i + j)) for j in range(500)] for i in range(0, rows, 500)]
    runs = [run_of([encode(r) for r in chunk], chunk[0].transaction_id) for chunk in chunks]

    def arrow(builder: Any, messages: list[Any]) -> None:
        """As read_stream does with a BatchBuilder (messages of Records) or a RunBuilder (RecordRuns)."""
        next_id = 0
        for message in messages:
            next_id = builder.add(next_id, message)
            if builder.rows >= 8192:
                builder.take()
        builder.take()

    def tuples() -> Iterator[tuple]:
        next_id = 0
        for chunk in chunks:
            check(0, next_id, chunk)
            next_id += len(chunk)
            for r in chunk:
                q = r.req_id
                yield (0, r.transaction_id, r.header, q.client_id, q.generation, q.seq_num, r.data)

    def via_spark() -> None:
        for _ in records_to_arrow_batches(tuples(), 10_000, SCHEMA, WaltzDataSource({})):
            pass

    return [
        (
            "worker: records -> Arrow by the source's builder",
            min(timed(lambda: arrow(BatchBuilder(0), chunks)) for _ in range(3)),
        ),
        (
            "worker: the same as raw runs -> Arrow by RunBuilder",
            min(timed(lambda: arrow(RunBuilder(0), runs)) for _ in range(3)),
        ),
        ("worker: records -> tuples -> Arrow by Spark", min(timed(via_spark) for _ in range(3))),
    ]


DECODE_JSON = ["--decoder", "waltz_spark.decoders:json_columns", "--decoder-option", "schema=n LONG, pad STRING"]
HEADLINE = "waltz-ingest from the cluster: stream availableNow -> Parquet"


def measure(
    workdir: Path, rows: int, partitions: int, reads_only: bool = False
) -> tuple[list[tuple[str, float]], list[str]]:
    per_partition = rows // partitions
    results: list[tuple[str, float]] = []
    notes: list[str] = []
    with LocalCluster(workdir / "cluster", storage_nodes=3, servers=1, partitions=partitions) as cluster:
        real = Target(cluster.zookeeper, cluster.paths.root)
        with ThreadPoolExecutor(partitions) as pool:
            seconds = timed(lambda: list(pool.map(lambda p: bulk_append(cluster, p, per_partition), range(partitions))))
        notes.append(f"filled the cluster with {rows} transactions in {seconds:.1f} s ({rows / seconds:,.0f}/s)")
        results.append(("read_task, Records (raw=false): checks + Arrow, 1 reader", raw_reads(real, partitions, 1)))
        results.append(("read_task, RecordRuns (raw=true): checks + Arrow, 1 reader",
                        raw_reads(real, partitions, 1, True)))
        two: list[float] = []
        usage = cpu_per_100k(cluster, rows, lambda: two.append(raw_reads(real, partitions, 2)))
        results.append(("read_task, Records (raw=false): checks + Arrow, 2 readers", two[0]))
        usage_runs = cpu_per_100k(cluster, rows, lambda: two.append(raw_reads(real, partitions, 2, True)))
        results.append(("read_task, RecordRuns (raw=true): checks + Arrow, 2 readers", two[1]))
        notes.append(f"CPU seconds per 100k records read (2 readers), records: {usage}")
        notes.append(f"CPU seconds per 100k records read (2 readers), raw=true runs: {usage_runs}")
        if reads_only:
            return results, notes
        with FakeWaltzServer(partitions=partitions, batch_size=500) as fake:
            for pid in range(partitions):
                fake.append(pid, per_partition, size=100)
            zk = zkmeta.connect(cluster.zookeeper)
            try:
                cluster_admin.create_cluster(zk, zkmeta.ZkPaths("/bench-fake"), "fake", partitions)
                register(zk, "/bench-fake", fake)
            finally:
                zk.stop()
                zk.close()
            fake_target = Target(cluster.zookeeper, "/bench-fake")
            results.append(("raw read from the in-memory fake server, 1 reader", raw_reads(fake_target, partitions, 1)))
            spark = spark_session()
            try:
                in_memory_to_parquet(spark, 1000, partitions, workdir / "warmup")
                batch_to_parquet(spark, fake_target, "waltz", workdir / "warmup-waltz")
                results.append(
                    (
                        "Spark: in-memory DataFrame -> Parquet (ceiling)",
                        in_memory_to_parquet(spark, rows, partitions, workdir / "memory"),
                    )
                )
                results.append((HEADLINE, best_ingest(spark, real, workdir / "ingest", [])))
                results.append(
                    (
                        "  the same with the json_columns decoder",
                        best_ingest(spark, real, workdir / "ingest-json", DECODE_JSON),
                    )
                )
                results.append(
                    (
                        "waltz-ingest from the in-memory fake server (Spark side alone)",
                        best_ingest(spark, fake_target, workdir / "ingest-fake", []),
                    )
                )
                arrow, tuples = best_batches(spark, fake_target, workdir / "batch")
                results.append(("batch read fake -> Parquet, Arrow batches (the source)", arrow))
                results.append(("batch read fake -> Parquet, plain tuples", tuples))
                landed = spark.read.parquet(str(workdir / "ingest" / "run0")).count()
                notes.append(f"the first ingest run landed {landed} rows (expected {rows})")
            finally:
                spark.stop()
    results.extend(conversions(min(rows, 100_000)))
    return results, notes


def report(rows: int, partitions: int, results: list[tuple[str, float]], notes: list[str]) -> str:
    times = dict(results)
    versus = "vs ingest" if HEADLINE in times else "vs first"
    headline = rows / times.get(HEADLINE, results[0][1])
    width = max(len(name) for name, _ in results)
    lines = [
        f"ingest bench: {rows} transactions of ~100 B in {partitions} partitions, Spark local[2], "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        f"{'measurement':<{width}}  {'seconds':>8}  {'rows/s':>10}  {versus:>9}",
    ]
    for name, seconds in results:
        count = min(rows, 100_000) if name.startswith("worker:") else rows
        rate = count / seconds
        lines.append(f"{name:<{width}}  {seconds:>8.2f}  {rate:>10,.0f}  {rate / headline:>8.2f}x")
    return "\n".join([*lines, *notes])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="transactions in all (default 200000)")
    parser.add_argument("--partitions", type=int, default=2, help="Waltz partitions (default 2)")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--reads-only", action="store_true", help="stop after the raw reads (no Spark)")
    parser.add_argument(
        "--conversions-only", action="store_true", help="only the worker rows (no cluster), on min(rows, 100000)"
    )
    args = parser.parse_args(argv)
    rows = args.rows // args.partitions * args.partitions
    if args.conversions_only:
        rows = min(rows, 100_000)
        print(report(rows, args.partitions, conversions(rows), []))
        return
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        results, notes = measure(workdir, rows, args.partitions, args.reads_only)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(rows, args.partitions, results, notes))


if __name__ == "__main__":
    main()
