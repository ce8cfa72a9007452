"""An in-memory WaltzServer on loopback (GetHighWaterMark, ReadTransactions) for tests and benchmarks.

It answers a raw ReadTransactions with RecordRuns (its records encoded as a data file holds them) unless
serves_raw is off, as a server that predates raw would; then, and for a request that is not raw, with Records.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc

from waltz.v1 import common_pb2, metadata_pb2, server_pb2, server_pb2_grpc
from waltz_common import zk as zkmeta
from waltz_common.record_layout import encode_record
from waltz_common.types import crc32


def record(partition: int, txn: int, data: bytes, header: int = 0, client_id: int = 7) -> common_pb2.Record:
    return common_pb2.Record(
        transaction_id=txn,
        req_id=common_pb2.ReqId(client_id=client_id, generation=1, partition_id=partition, seq_num=txn + 100),
        header=header,
        data_length=len(data),
        data=data,
        checksum=crc32(data),
    )


def encode(record: common_pb2.Record) -> bytes:
    """The record as a storage node's data file holds it, with its data_length as given (a test's may be wrong)."""
    return encode_record(record, record.data_length)


def run_of(encoded: Sequence[bytes], first: int) -> common_pb2.RecordRun:
    """A RecordRun of encoded records (encode()) that are transactions first.., its ends as they travel."""
    ends, end = [], 0
    for piece in encoded:
        end += len(piece)
        ends.append(end)
    return common_pb2.RecordRun(
        first_transaction_id=first,
        count=len(encoded),
        records=b"".join(encoded),
        ends=struct.pack(f"<{len(ends)}I", *ends),
    )


class FakeWaltzServer(server_pb2_grpc.WaltzServerServicer):
    """In-memory committed logs per partition; can cut a stream once after n records and corrupt a record."""

    def __init__(self, partitions: int = 2, batch_size: int = 100) -> None:
        self.logs: dict[int, list[common_pb2.Record]] = {pid: [] for pid in range(partitions)}
        self.encoded: dict[int, list[bytes]] = {pid: [] for pid in range(partitions)}
        """each log's records encoded once, for raw reads"""
        self.serves_raw = True
        self.batch_size = batch_size
        self.cut_after: int | None = None
        self.requests: list[server_pb2.ReadTransactionsRequest] = []
        self.high_water_mark_calls = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0

    def append(self, partition: int, count: int, size: int = 16) -> None:
        with self._lock:
            log = self.logs[partition]
            for _ in range(count):
                txn = len(log)
                log.append(record(partition, txn, f"p{partition}-t{txn}-".encode().ljust(size, b"x"), header=txn % 7))
                self.encoded[partition].append(encode(log[-1]))

    def corrupt(self, partition: int, txn: int) -> None:
        """Flip a bit of the record's data checksum (in its raw form too, where its record CRC-32 stays right)."""
        self.logs[partition][txn].checksum ^= 1
        self.encoded[partition][txn] = encode(self.logs[partition][txn])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeWaltzServer:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server_pb2_grpc.add_WaltzServerServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()

    def __enter__(self) -> FakeWaltzServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def GetHighWaterMark(
        self, request: server_pb2.HighWaterMarkRequest, context: grpc.ServicerContext
    ) -> server_pb2.HighWaterMarkResponse:
        self.high_water_mark_calls += 1
        if request.partition_id not in self.logs:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"partition {request.partition_id} is not here")
        return server_pb2.HighWaterMarkResponse(
            partition_id=request.partition_id, high_water_mark=len(self.logs[request.partition_id]) - 1
        )

    def ReadTransactions(
        self, request: server_pb2.ReadTransactionsRequest, context: grpc.ServicerContext
    ) -> Iterator[server_pb2.ReadTransactionsResponse]:
        self.requests.append(request)
        if request.partition_id not in self.logs:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"partition {request.partition_id} is not here")
        log = self.logs[request.partition_id]
        first, last = request.from_transaction_id, request.to_transaction_id
        if first < 0 or last >= len(log):
            context.abort(grpc.StatusCode.OUT_OF_RANGE, f"{first}..{last} is beyond high-water mark {len(log) - 1}")
        size = min(request.batch_size or self.batch_size, self.batch_size)
        raw = request.raw and self.serves_raw
        sent = 0
        for start in range(first, last + 1, size):
            end = min(start + size, last + 1)
            if self.cut_after is not None and sent + end - start > self.cut_after:
                self.cut_after = None
                context.abort(grpc.StatusCode.UNAVAILABLE, "cut on purpose")
            sent += end - start
            if raw:
                run = run_of(self.encoded[request.partition_id][start:end], start)
                yield server_pb2.ReadTransactionsResponse(partition_id=request.partition_id, run=run)
            else:
                yield server_pb2.ReadTransactionsResponse(partition_id=request.partition_id, records=log[start:end])


def register(zk: Any, root: str, server: FakeWaltzServer, server_id: int = 0) -> None:
    """Make the fake server the live owner of every partition of the cluster at root (which must exist)."""
    paths = zkmeta.ZkPaths(root)
    host, port = server.address.rsplit(":", 1)
    descriptor = metadata_pb2.ServerDescriptor(server_id=server_id, host=host, port=int(port))
    if zk.exists(paths.server(server_id)):
        zkmeta.write(zk, paths.server(server_id), descriptor)
    else:
        zkmeta.create(zk, paths.server(server_id), descriptor)
    assignment = metadata_pb2.ServerAssignment(
        partitions=[
            metadata_pb2.PartitionOwnership(partition_id=pid, server_id=server_id, generation=1) for pid in server.logs
        ]
    )
    zkmeta.write(zk, paths.server_assignment, assignment)


def local_spark(app_name: str) -> Any:
    """A small `local[2]` session for tests and benchmarks (no UI, this interpreter), the waltz source registered."""
    import os
    import sys

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from waltz_spark.source import WaltzDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.dataSource.register(WaltzDataSource)
    return session
