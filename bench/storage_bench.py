"""Storage node append throughput over the gRPC stream, next to a raw write + fdatasync loop on the same disk.

    .venv/bin/python -m bench.storage_bench [--dir DIR] [--scale X]

Starts ZooKeeper and one `waltz-storage` process on loopback (LocalCluster), appends batches of
1, 10 and 100 records of 512 B to one partition over one Session stream, one at a time or pipelined
up to the node's per-partition queue, and runs a raw os.write + os.fdatasync loop of the same bytes per
sync in this process, in the same directory. Prints a table; asserts nothing. The node's CPU per
record and per append (user + system, read from the process) is the figure to compare between
runs on a shared machine; the latency of a row with one append in flight is the p50 of its appends.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import resource
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from waltz.v1 import common_pb2, storage_pb2, storage_pb2_grpc
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import crc32
from waltz_common.wire import record_from_proto
from waltz_storage.batch import encode_records
from waltz_storage.codec import encoded_record_size
from waltz_storage.service import PARTITION_QUEUE_SIZE

RECORD_BYTES = 512
# (records per append, appends in flight, appends per run at --scale 1, records sent encoded). Rows with one
# in flight are not pipelined: 100 records one at a time, encoded, is what a server sends each replica
# (storage.maxBatchesInFlight 1); the others send Record messages, as tools and catch-up do.
RUNS = (
    (1, 1, 1000, False),
    (100, 1, 1000, False),
    (100, 1, 1000, True),
    (1, PARTITION_QUEUE_SIZE, 4000, False),
    (10, PARTITION_QUEUE_SIZE, 2000, False),
    (100, PARTITION_QUEUE_SIZE, 400, False),
    (100, PARTITION_QUEUE_SIZE, 400, True),
)
RAW_SECONDS = 2.0


@dataclass
class Result:
    requests: int
    records: int
    bytes: int
    fsyncs: int
    seconds: float
    cpu_seconds: float = 0.0
    p50_seconds: float = float("nan")

    def rate(self, amount: float) -> float:
        return amount / self.seconds


def raw_loop(directory: Path, batch: int, seconds: float = RAW_SECONDS) -> Result:
    """The floor: append one batch's bytes and fdatasync, again and again for seconds, to a fresh file."""
    block = batch * encoded_record_size(RECORD_BYTES)
    path = directory / f"raw-{block}.dat"
    data = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    syncs = 0
    try:
        cpu = _thread_cpu()
        started = time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            os.write(fd, data)
            os.fdatasync(fd)
            syncs += 1
        cpu = _thread_cpu() - cpu
    finally:
        os.close(fd)
        path.unlink()
    return Result(syncs, batch * syncs, block * syncs, syncs, elapsed, cpu)


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def best(a: Result, b: Result) -> Result:
    return a if a.rate(a.fsyncs) >= b.rate(b.fsyncs) else b


def fsync_count(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as page:
        text = page.read().decode()
    match = re.search(r"^waltz_storage_fsync_duration_seconds_count (\S+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def build_requests(
    first_txn: int, batch: int, count: int, encoded: bool = False
) -> list[storage_pb2.StorageRequest]:
    """count appends of batch records each from first_txn, as Record messages or (encoded) in the data file's
    layout, as a Waltz server sends them (StorageAppendRequest.encoded_records)."""
    payload = os.urandom(RECORD_BYTES)
    checksum = crc32(payload)
    requests = []
    txn = first_txn
    for seq in range(count):
        records = [
            common_pb2.Record(
                transaction_id=t,
                req_id=common_pb2.ReqId(client_id=1, generation=1, partition_id=0, seq_num=t),
                data_length=RECORD_BYTES,
                data=payload,
                checksum=checksum,
            )
            for t in range(txn, txn + batch)
        ]
        txn += batch
        append = storage_pb2.StorageAppendRequest(
            session_id=1, seq_num=seq, partition_id=0, record_list_length=batch
        )
        if encoded:
            batch_bytes = encode_records(records[0].transaction_id, [record_from_proto(r) for r in records]).data
            append.encoded_records = bytes(batch_bytes)
        else:
            append.records.extend(records)
        requests.append(storage_pb2.StorageRequest(append=append))
    return requests


async def pipelined_appends(
    address: str,
    cluster_key: str,
    requests: list[storage_pb2.StorageRequest],
    in_flight: int,
    latencies: list[float] | None = None,
) -> float:
    """Send every request with at most in_flight unanswered; seconds until the last answer.

    With in_flight 1, latencies (if given) gets each append's round trip."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = storage_pb2_grpc.WaltzStorageStub(channel).Session()
        open_request = storage_pb2.OpenRequest(
            session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key, num_partitions=1
        )
        await call.write(storage_pb2.StorageRequest(open=open_request))
        assert (await call.read()).WhichOneof("response") == "success"
        window = asyncio.Semaphore(in_flight)

        sent = 0.0

        async def receive() -> None:
            for _ in requests:
                response = await call.read()
                if latencies is not None and in_flight == 1:
                    latencies.append(time.perf_counter() - sent)
                if response.WhichOneof("response") != "success":
                    raise RuntimeError(f"append refused: {response}")
                window.release()

        started = time.perf_counter()
        receiver = asyncio.create_task(receive())
        for request in requests:
            await window.acquire()
            sent = time.perf_counter()
            await call.write(request)
        await receiver
        elapsed = time.perf_counter() - started
        await call.done_writing()
        return elapsed


Row = tuple[int, int, bool, Result, Result]  # batch, in flight, encoded, the node's result, the raw loop's


def run(directory: Path, scale: float) -> list[Row]:
    """Each run: the raw loop, the node, the raw loop again (the faster raw run is the floor: disks are shared)."""
    rows = []
    with LocalCluster(directory / "cluster", storage_nodes=1, servers=0, partitions=1) as cluster:
        node = cluster.storage[0]
        assert node.pid is not None
        process = psutil.Process(node.pid)
        next_txn = 0
        for batch, in_flight, base, encoded in RUNS:
            count = max(10, int(base * scale))
            requests = build_requests(next_txn, batch, count, encoded)
            next_txn += batch * count
            raw = raw_loop(node.directory.parent, batch)
            before = fsync_count(node.metrics_port)
            latencies: list[float] = []
            cpu_before = _cpu(process)
            seconds = asyncio.run(
                pipelined_appends(node.connect_string, cluster.cluster_key, requests, in_flight, latencies)
            )
            cpu = _cpu(process) - cpu_before
            fsyncs = fsync_count(node.metrics_port) - before
            records = batch * count
            p50 = sorted(latencies)[len(latencies) // 2] if latencies else float("nan")
            storage = Result(count, records, records * encoded_record_size(RECORD_BYTES), fsyncs, seconds, cpu, p50)
            rows.append((batch, in_flight, encoded, storage, best(raw, raw_loop(node.directory.parent, batch))))
    return rows


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def report(rows: list[Row]) -> str:
    head = (
        f"{'batch':>5} {'as':>7} {'in flight':>9} | {'appends/s':>9} {'records/s':>9} {'MB/s':>6} {'fsyncs/s':>8} | "
        f"{'raw records/s':>13} {'MB/s':>6} {'fsyncs/s':>8} | {'MB/s ratio':>10} {'appends/s : raw fsyncs/s':>24} | "
        f"{'node CPU us/record':>18} {'us/append':>9} {'p50 ms':>6} | {'raw CPU us/fsync':>16}"
    )
    lines = [head, "-" * len(head)]
    ratios = {}
    for batch, in_flight, encoded, node, raw in rows:
        mb_ratio = node.rate(node.bytes) / raw.rate(raw.bytes)
        sync_ratio = node.rate(node.requests) / raw.rate(raw.fsyncs)
        ratios[batch, in_flight, encoded] = mb_ratio, sync_ratio
        lines.append(
            f"{batch:>5} {'encoded' if encoded else 'records':>7} {in_flight:>9} | "
            f"{node.rate(node.requests):>9,.0f} {node.rate(node.records):>9,.0f} "
            f"{node.rate(node.bytes) / 1e6:>6.2f} {node.rate(node.fsyncs):>8,.0f} | "
            f"{raw.rate(raw.records):>13,.0f} {raw.rate(raw.bytes) / 1e6:>6.2f} {raw.rate(raw.fsyncs):>8,.0f} | "
            f"{mb_ratio:>10.2f} {sync_ratio:>24.2f} | "
            f"{node.cpu_seconds / node.records * 1e6:>18.1f} {node.cpu_seconds / node.requests * 1e6:>9.1f} "
            f"{node.p50_seconds * 1e3:>6.2f} | {raw.cpu_seconds / raw.fsyncs * 1e6:>16.1f}"
        )
    mb_ratio = ratios[100, PARTITION_QUEUE_SIZE, True][0]
    records_ratio = ratios[100, PARTITION_QUEUE_SIZE, False][0]
    sync_ratio = ratios[1, PARTITION_QUEUE_SIZE, False][1]
    lines += [
        f"target, batches of 100: node MB/s >= 0.5 x raw MB/s: {mb_ratio:.2f} encoded, as a Waltz server sends "
        f"them ({'met' if mb_ratio >= 0.5 else 'MISSED'}); {records_ratio:.2f} as Record messages",
        f"target, batches of 1: acknowledged appends/s >= 0.5 x raw fsyncs/s: {sync_ratio:.2f} "
        f"({'met' if sync_ratio >= 0.5 else 'MISSED'})",
        f"MB = 1e6 bytes as written ({encoded_record_size(RECORD_BYTES)} B per {RECORD_BYTES} B record). Node fsyncs/s "
        "counts its data fdatasyncs: appends waiting together in a partition's queue share one (group commit), and "
        "each is acknowledged only after the fdatasync that covers it. The raw loop syncs one batch's bytes per "
        "fdatasync; it is the faster of a run before and one after the node's. Node CPU is the storage process's "
        "user + system time during the run (the fdatasync's own time included); p50 ms is one append's round trip, "
        "measured only when appends are not pipelined. Raw CPU is the raw loop's own user + system time per write "
        "and fdatasync: the part of the node's CPU that a durable append cannot avoid. As: the records sent as "
        "Record messages, or encoded in the data file's layout (encoded_records, as a Waltz server sends them).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.storage_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one); sets the disk")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of requests per run")
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="waltz-storage-bench-", dir=args.dir) as workdir:
        print(report(run(Path(workdir), args.scale)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
