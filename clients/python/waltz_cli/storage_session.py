"""A synchronous client of a storage node's Session stream (offline partition recovery; tests write online)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from waltz.v1 import common_pb2, storage_pb2, storage_pb2_grpc
from waltz_cli.errors import CliError, rpc_message
from waltz_common import tls
from waltz_common.wire import record_to_proto

_END = object()


def to_proto(record: Any) -> common_pb2.Record:
    """A record from the admin client (protobuf or waltz_common.types.Record) as a protobuf Record."""
    if isinstance(record, common_pb2.Record):
        return record
    return record_to_proto(record)


class StorageSession:
    """One Session stream, one request at a time; every failure is a CliError naming the node.

    offline=True marks every request as offline recovery (the partition must be unwritable, no fencing).
    """

    def __init__(
        self,
        target: str,
        cluster_key: str,
        num_partitions: int,
        timeout_s: float,
        *,
        offline: bool = True,
        tls_files: tls.TlsFiles | None = None,
    ) -> None:
        self.target = target
        self.offline = offline
        self._timeout = timeout_s
        self._seq = 0
        self._requests: queue.Queue[object] = queue.Queue()
        self._responses: queue.Queue[object] = queue.Queue()
        self._channel = tls.channel(target, tls_files)
        stub = storage_pb2_grpc.WaltzStorageStub(self._channel)
        self._call = stub.Session(self._outgoing())
        self._reader = threading.Thread(target=self._read, name=f"storage-session-{target}", daemon=True)
        self._reader.start()
        opening = storage_pb2.OpenRequest(
            session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key, num_partitions=num_partitions
        )
        try:
            self._request("open", opening)
        except BaseException:
            self.close()
            raise

    def _outgoing(self) -> Iterator[storage_pb2.StorageRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            assert isinstance(item, storage_pb2.StorageRequest)
            yield item

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
            self._responses.put(CliError(f"storage node {self.target} closed the session stream"))
        except grpc.RpcError as exc:
            self._responses.put(CliError(rpc_message(exc, f"storage node {self.target}")))

    def _request(self, field: str, message: Any) -> storage_pb2.StorageResponse:
        self._requests.put(storage_pb2.StorageRequest(**{field: message}))
        try:
            response = self._responses.get(timeout=self._timeout)
        except queue.Empty:
            raise CliError(f"storage node {self.target}: no answer to {field} within {self._timeout:g} s") from None
        if isinstance(response, CliError):
            raise response
        assert isinstance(response, storage_pb2.StorageResponse)
        if response.WhichOneof("response") == "failure":
            raise CliError(f"storage node {self.target}: {field} refused: {response.failure.exception.message}")
        return response

    def _send(self, field: str, cls: Any, partition_id: int, session_id: int, **values: Any) -> Any:
        self._seq += 1
        message = cls(
            session_id=session_id, seq_num=self._seq, partition_id=partition_id, offline=self.offline, **values
        )
        return self._request(field, message)

    def max_transaction_id(self, partition_id: int, session_id: int) -> int:
        """The partition's max transaction id (a read: it never raises the node's session fence)."""
        response = self._send("max_transaction_id", storage_pb2.MaxTransactionIdRequest, partition_id, session_id)
        return int(response.max_transaction_id.transaction_id)

    def truncate(self, partition_id: int, session_id: int, transaction_id: int) -> int:
        """Truncate; returns the max transaction id afterwards."""
        response = self._send(
            "truncate", storage_pb2.TruncateRequest, partition_id, session_id, transaction_id=transaction_id
        )
        return int(response.max_transaction_id.transaction_id)

    def append(self, partition_id: int, session_id: int, records: Sequence[Any]) -> None:
        """Append consecutive records (fsynced by the node before it answers)."""
        protos = [to_proto(r) for r in records]
        self._send(
            "append",
            storage_pb2.StorageAppendRequest,
            partition_id,
            session_id,
            record_list_length=len(protos),
            records=protos,
        )

    def set_low_water_mark(self, partition_id: int, session_id: int, low_water_mark: int) -> None:
        """SetLowWaterMark: records (session, lwm, local lwm = max txn) in the control file."""
        self._send(
            "set_low_water_mark",
            storage_pb2.SetLowWaterMarkRequest,
            partition_id,
            session_id,
            low_water_mark=low_water_mark,
        )

    def close(self) -> None:
        self._requests.put(_END)
        self._call.cancel()
        self._channel.close()
        self._reader.join(timeout=5)

    def __enter__(self) -> StorageSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
