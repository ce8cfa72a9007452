"""Read one range of one partition from its server with ReadTransactions, checked, as Arrow batches."""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import grpc
import pyarrow as pa

from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_common.tls import TlsFiles
from waltz_common.types import crc32_unsigned
from waltz_common.zk_security import ZkSecurity
from waltz_spark.cluster import CHANNEL_OPTIONS, ClusterDirectory, PartitionUnavailable, describe, is_retryable
from waltz_spark.planning import split_range
from waltz_spark.rows import ARROW_BATCH_ROWS as ARROW_BATCH_ROWS
from waltz_spark.rows import ARROW_SCHEMA as ARROW_SCHEMA
from waltz_spark.rows import BrokenRange as BrokenRange
from waltz_spark.rows import ChecksumMismatch as ChecksumMismatch
from waltz_spark.rows import check
from waltz_spark.runs import MAX_BATCH_DATA, RunBuilder

MIN_STREAM_RECORDS = 10_000
"""A task reads over several streams only when each gets at least this many records."""


@dataclass(frozen=True)
class ReadTask:
    """Transactions first..last of one partition, where its owner was at planning, and how to look it up again."""

    zookeeper: str
    root: str
    partition: int
    first: int
    last: int
    address: str
    batch_size: int = 0
    timeout_s: float = 30.0
    tls: TlsFiles | None = None
    zookeeper_security: ZkSecurity | None = None
    servers: tuple[str, ...] = ()
    streams: int = 1
    raw: bool = True
    """Ask for RecordRuns (False: Records, as from a server that predates them; the benchmarks compare both)."""


def read_task(task: ReadTask, locate: Callable[[ReadTask, str], str] | None = None) -> Iterator[pa.RecordBatch]:
    """The task's records as Arrow batches, over task.streams ReadTransactions calls at once when it is long enough.

    Rows come in no particular order when there are several streams (a micro-batch is the whole range or fails).
    """
    pieces = split_range(task.first, task.last, task.streams, MIN_STREAM_RECORDS)
    if len(pieces) == 1:
        return read_stream(task, locate)
    return merged([replace(task, first=first, last=last, streams=1) for first, last in pieces], locate)


def merged(tasks: Sequence[ReadTask], locate: Callable[[ReadTask, str], str] | None) -> Iterator[pa.RecordBatch]:
    """The batches of every task as each thread reads them; the first error of any ends the whole read.

    While the worker's Python checks one stream's records, the servers fill the others: a read waits less on the
    round trips between the server and its storage nodes (bench/ingest_bench.py: 1 reader against 2).
    """
    results: queue.Queue[object] = queue.Queue(maxsize=2 * len(tasks))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                results.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(task: ReadTask) -> None:
        try:
            for batch in read_stream(task, locate):
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it in the task
            put(exc)

    threads = [threading.Thread(target=run, args=(t,), name=f"waltz-read-{t.first}", daemon=True) for t in tasks]
    for thread in threads:
        thread.start()
    try:
        finished = 0
        while finished < len(threads):
            item = results.get()
            if item is _DONE:
                finished += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()  # a thread still reading stops at its next batch


_DONE = object()


def read_stream(task: ReadTask, locate: Callable[[ReadTask, str], str] | None = None) -> Iterator[pa.RecordBatch]:
    """One ReadTransactions of the task's range; after a retryable failure resumes at the next id from the owner."""
    locate = locate or locate_owner
    builder = BatchBuilder(task.partition)  # a server that predates raw answers with Records
    runs = RunBuilder(task.partition)
    next_id = task.first
    address = task.address or locate(task, "")  # no owner when planned: look again before the first try
    deadline = time.monotonic() + task.timeout_s
    delay = 0.05
    while next_id <= task.last:
        try:
            for records in fetch(
                address, task.partition, next_id, task.last, task.batch_size, task.timeout_s, task.tls, task.raw
            ):
                if isinstance(records, common_pb2.RecordRun):
                    if builder.rows:  # the rows stay in order across a resumption at another server
                        yield builder.take()
                    next_id = runs.add(next_id, records)
                    if runs.rows >= ARROW_BATCH_ROWS or runs.data_bytes >= MAX_BATCH_DATA // 2:
                        yield runs.take()
                else:
                    if runs.rows:
                        yield runs.take()
                    next_id = builder.add(next_id, records)
                    if builder.rows >= ARROW_BATCH_ROWS:
                        yield builder.take()
                deadline = time.monotonic() + task.timeout_s
            if next_id <= task.last:
                raise PartitionUnavailable(f"stream ended at transaction {next_id - 1}, before {task.last}")
        except (grpc.RpcError, PartitionUnavailable) as exc:
            if not is_retryable(exc) or time.monotonic() + delay > deadline:
                raise PartitionUnavailable(
                    f"cannot read partition {task.partition} transactions {next_id}..{task.last} "
                    f"from {address}: {describe(exc)}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            address = locate(task, address)
    if builder.rows:
        yield builder.take()
    if runs.rows:
        yield runs.take()


def fetch(
    address: str,
    partition: int,
    first: int,
    last: int,
    batch_size: int,
    timeout_s: float,
    tls_files: TlsFiles | None = None,
    raw: bool = True,
) -> Iterator[common_pb2.RecordRun | Sequence[common_pb2.Record]]:
    """The records of ReadTransactions(first..last), one server message at a time.

    raw asks for RecordRuns (records as the data files hold them, parsed without a protobuf message each); a
    server that predates raw answers with Records all the same, so each message gives whichever it holds.
    """
    request = server_pb2.ReadTransactionsRequest(
        partition_id=partition, from_transaction_id=first, to_transaction_id=last, batch_size=batch_size, raw=raw
    )
    # The whole range gets a deadline that grows with its size (at least 1000 records/s is assumed).
    deadline = timeout_s + (last - first + 1) / 1000.0
    stub = server_pb2_grpc.WaltzServerStub(channel(address, tls_files))
    for response in stub.ReadTransactions(request, timeout=deadline):
        yield response.run if response.HasField("run") else response.records


_channels: OrderedDict[tuple[str, TlsFiles | None, tuple[tuple[int, int], ...]], grpc.Channel] = OrderedDict()
CACHED_CHANNELS = 16


def channel(address: str, tls_files: TlsFiles | None) -> grpc.Channel:
    """A channel to address kept for the worker's next tasks: a micro-batch's task connects no more than once.

    Spark reuses its Python workers, so without this every task of every micro-batch paid a connection (and a
    TLS handshake). Certificate files that change on disk get a new channel, as tls.channel reads them again.
    """
    stamps = () if tls_files is None else tls_files.stamp()
    key = (address, tls_files, stamps)
    found = _channels.get(key)
    if found is None:
        found = _channels[key] = tls.channel(address, tls_files, CHANNEL_OPTIONS)
        while len(_channels) > CACHED_CHANNELS:
            _channels.popitem(last=False)[1].close()
    _channels.move_to_end(key)
    return found


def locate_owner(task: ReadTask, previous: str) -> str:
    """The partition's owner now, from ZooKeeper or the servers; the previous address when it cannot be looked up."""
    try:
        with ClusterDirectory(
            task.zookeeper, task.root, min(task.timeout_s, 10.0), task.tls, task.zookeeper_security, task.servers
        ) as directory:
            return directory.owner(task.partition)
    except Exception:  # the retry loop reports the read error; a failed lookup only means "same place"
        return previous


class BatchBuilder:
    """Columns of records accumulating into one Arrow RecordBatch."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._clear()

    def _clear(self) -> None:
        self.ids: list[int] = []
        self.headers: list[int] = []
        self.client_ids: list[int] = []
        self.generations: list[int] = []
        self.seq_nums: list[int] = []
        self.data: list[bytes] = []

    @property
    def rows(self) -> int:
        return len(self.ids)

    def add(self, expected_first: int, records: Sequence[common_pb2.Record]) -> int:
        """Check (as check() does) and append records that must start at expected_first; returns the next id.

        One pass with the appends bound once: the reader's Python time is this loop's attribute reads, and
        a second pass for the checks cost a third more per record (bench/ingest_bench.py, worker rows).
        """
        partition, expected = self.partition, expected_first
        crc = crc32_unsigned
        ids, headers, client_ids = self.ids.append, self.headers.append, self.client_ids.append
        generations, seq_nums, data_ = self.generations.append, self.seq_nums.append, self.data.append
        for record in records:
            data = record.data
            req_id = record.req_id
            if (
                record.transaction_id != expected
                or record.data_length != len(data)
                or (crc(data) - record.checksum) & 0xFFFFFFFF
                or req_id.partition_id != partition
            ):
                check(partition, expected, [record])  # raises, naming what is wrong
            ids(expected)
            headers(record.header)
            client_ids(req_id.client_id)
            generations(req_id.generation)
            seq_nums(req_id.seq_num)
            data_(data)
            expected += 1
        return expected

    def take(self) -> pa.RecordBatch:
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.partition] * self.rows, pa.int32()),
                pa.array(self.ids, pa.int64()),
                pa.array(self.headers, pa.int32()),
                pa.array(self.client_ids, pa.int32()),
                pa.array(self.generations, pa.int32()),
                pa.array(self.seq_nums, pa.int32()),
                pa.array(self.data, pa.binary()),
            ],
            schema=ARROW_SCHEMA,
        )
        self._clear()
        return batch
