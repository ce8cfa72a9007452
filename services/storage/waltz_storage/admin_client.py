"""A synchronous client of a storage node's admin stream, for the CLI and test clusters."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from waltz.v1 import storage_admin_pb2, storage_admin_pb2_grpc
from waltz_common import tls
from waltz_common.types import Record
from waltz_storage.protocol import Code, record_from_proto

_EOF = object()


class StorageAdminError(Exception):
    """The storage node refused an admin request, or could not be reached; the message says why."""

    def __init__(self, message: str, code: int = Code.ERROR_CODE_UNSPECIFIED) -> None:
        super().__init__(message)
        self.code = code

    @property
    def code_name(self) -> str:
        return Code.Name(self.code)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One assigned partition as the node reports it; error is non-empty when it cannot be opened, write_failure
    while its writes fail on the disk."""

    partition_id: int
    readable: bool
    writable: bool
    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    max_transaction_id: int
    error: str
    write_failure: str = ""
    fence_session_id: int = -1
    committed_high_water_mark: int = -1
    damaged_transaction_ids: tuple[int, ...] = ()
    """Records held that fail their checksums, not yet repaired."""


@dataclass(frozen=True, slots=True)
class RangeDigest:
    """A digest of record_count consecutive records from transaction_id, and the partition's state then."""

    transaction_id: int
    record_count: int
    digest: bytes
    max_transaction_id: int
    low_water_mark: int


class StorageAdminClient:
    """One open admin stream to a storage node; requests are sent one at a time. Not thread-safe."""

    def __init__(
        self,
        host: str,
        admin_port: int,
        cluster_key: str,
        num_partitions: int,
        timeout: float = 10.0,
        tls_files: tls.TlsFiles | None = None,
    ) -> None:
        self.address = f"{host}:{admin_port}"
        self.timeout = timeout
        self._seq = 0
        self._channel = tls.channel(self.address, tls_files, [("grpc.max_receive_message_length", -1)])
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._reader: threading.Thread | None = None
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            plain = "plaintext" if tls_files is None else "TLS"
            raise StorageAdminError(
                f"storage admin port {self.address} is not reachable within {timeout:g} s over {plain} "
                "(is the node running, and do both sides agree on TLS and trust each other's CA?)"
            ) from None
        stub = storage_admin_pb2_grpc.WaltzStorageAdminStub(self._channel)
        self._call = stub.Admin(iter(self._outbox.get, _EOF))
        self._reader = threading.Thread(target=self._read, name=f"admin-{self.address}", daemon=True)
        self._reader.start()
        try:
            self._request(
                "open",
                storage_admin_pb2.AdminOpenRequest(seq_num=-1, cluster_key=cluster_key, num_partitions=num_partitions),
            )
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        try:
            for response in self._call:
                self._inbox.put(response)
        except grpc.RpcError as e:
            self._inbox.put(e)
        finally:
            self._inbox.put(_EOF)

    def _request(self, kind: str, msg: Any) -> storage_admin_pb2.AdminResponse:
        if kind != "open":
            self._seq += 1
            msg.seq_num = self._seq
        self._outbox.put(storage_admin_pb2.AdminRequest(**{kind: msg}))
        try:
            response = self._inbox.get(timeout=self.timeout)
        except queue.Empty:
            self._call.cancel()
            raise StorageAdminError(
                f"storage node {self.address} did not answer {kind} within {self.timeout:g} s"
            ) from None
        if response is _EOF or isinstance(response, grpc.RpcError):
            self._inbox.put(response)  # later requests fail the same way
            detail = (
                f"{response.code().name}: {response.details()}"
                if isinstance(response, grpc.RpcError)
                else "stream ended"
            )
            raise StorageAdminError(f"storage node {self.address}: admin stream closed: {detail}")
        if response.WhichOneof("response") == "failure":
            exc = response.failure.exception
            raise StorageAdminError(f"storage node {self.address}: {exc.message}", exc.code)
        return response

    def assign(self, partition_id: int) -> None:
        """Create the partition on the node (no-op when it is already there)."""
        self._request(
            "partition_assignment",
            storage_admin_pb2.PartitionAssignmentRequest(partition_id=partition_id, toggled=True),
        )

    def unassign(self, partition_id: int) -> None:
        """Delete the partition and its files from the node."""
        self._request(
            "partition_assignment",
            storage_admin_pb2.PartitionAssignmentRequest(partition_id=partition_id, toggled=False),
        )

    def set_readable(self, partition_id: int, readable: bool) -> None:
        self._request(
            "partition_read", storage_admin_pb2.PartitionReadRequest(partition_id=partition_id, toggled=readable)
        )

    def set_writable(self, partition_id: int, writable: bool) -> None:
        self._request(
            "partition_write", storage_admin_pb2.PartitionWriteRequest(partition_id=partition_id, toggled=writable)
        )

    def list_partitions(self) -> list[PartitionState]:
        """Every partition assigned to the node, by id."""
        response = self._request("partition_list", storage_admin_pb2.PartitionListRequest())
        return [
            PartitionState(
                p.partition_id,
                p.readable,
                p.writable,
                p.session_id,
                p.low_water_mark,
                p.local_low_water_mark,
                p.max_transaction_id,
                p.error,
                p.write_failure,
                p.fence_session_id,
                p.committed_high_water_mark,
                tuple(p.damaged_transaction_ids),
            )
            for p in response.partition_list.partitions
        ]

    def record_list(self, partition_id: int, transaction_id: int, max_records: int) -> list[Record]:
        """Up to max_records consecutive records from transaction_id (fewer at the end, or past a size cap)."""
        response = self._request(
            "record_list",
            storage_admin_pb2.AdminRecordListRequest(
                partition_id=partition_id, transaction_id=transaction_id, max_records=max_records
            ),
        )
        return [record_from_proto(r) for r in response.record_list.records]

    def reset_fence(self, partition_id: int, session_id: int) -> None:
        """Set a poisoned session fence back to session_id (the partition must be unwritable)."""
        self._request(
            "fence_reset",
            storage_admin_pb2.PartitionFenceResetRequest(partition_id=partition_id, session_id=session_id),
        )

    def digest(self, partition_id: int, transaction_id: int, max_records: int) -> RangeDigest:
        """The node's digest of up to max_records records from transaction_id (fewer at the end or its cap)."""
        response = self._request(
            "digest",
            storage_admin_pb2.PartitionDigestRequest(
                partition_id=partition_id, transaction_id=transaction_id, max_records=max_records
            ),
        ).digest
        return RangeDigest(
            response.transaction_id,
            response.record_count,
            response.digest,
            response.max_transaction_id,
            response.low_water_mark,
        )

    def close(self) -> None:
        """Half-close the stream and release the channel; safe to call twice."""
        self._outbox.put(_EOF)
        if self._reader is not None:
            self._reader.join(timeout=self.timeout)
            self._reader = None
        self._channel.close()

    def __enter__(self) -> StorageAdminClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
