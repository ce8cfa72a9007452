"""Carry out one storage request (or a run of appends) against the engine; blocking, one partition at a time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from waltz.v1 import storage_pb2
from waltz_storage import protocol, rules
from waltz_storage.batch import encode_appends
from waltz_storage.codec import RecordFields
from waltz_storage.errors import InvalidRequest
from waltz_storage.health import WriteFailures, is_disk_failure
from waltz_storage.metrics import StorageMetrics
from waltz_storage.partition import StoragePartition
from waltz_storage.storage_manager import StorageManager

READS = frozenset({"record_header", "record", "record_header_list", "record_list"})
WRITES = rules.WRITES
MAX_LIST_LENGTH = 10_000  # records or headers in one list response, whatever was asked
MAX_GROUP_REQUESTS = 1000  # appends merged into one write and fdatasync
MAX_DAMAGED_LISTED = 10_000  # damaged ids in one answer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """Sizes the node accepts in a request and puts in a response."""

    max_record_bytes: int
    max_batch_bytes: int
    max_list_length: int = MAX_LIST_LENGTH


class Answerable(Protocol):
    """Where a stream request's answers go: the stream it came from."""

    def answer(self, partition_id: int, responses: list[storage_pb2.StorageResponse]) -> None:
        """Hand over answers to requests of partition_id, in order; called on the partition's thread."""


class StreamRequest(NamedTuple):
    """A request of a Session stream (any kind but open) waiting for its partition's thread."""

    kind: str
    msg: Any
    stream: Answerable
    caller: rules.Caller = rules.PLAINTEXT


class Answers(NamedTuple):
    """The answers to a group of one stream's requests of one partition, in order."""

    stream: Answerable
    partition_id: int
    responses: list[storage_pb2.StorageResponse]


def _batch_bytes(msg: storage_pb2.StorageAppendRequest) -> int:
    """An upper bound of the batch's size on disk, without touching each record (the hot path)."""
    return msg.ByteSize() + 40 * len(msg.records)


def _mergeable(first: StreamRequest, other: StreamRequest) -> bool:
    return (
        other.kind == "append"
        and other.stream is first.stream
        and other.msg.session_id == first.msg.session_id
        and other.msg.offline == first.msg.offline
    )


def admit(
    partition: StoragePartition, kind: str, session_id: int, offline: bool, caller: rules.Caller = rules.PLAINTEXT
) -> None:
    """Permission and fencing: raise unless this caller's request may run on the partition now. A server-role
    request of a newer session raises the fence (the new owner's first request shuts the old owner out before
    its recovery reads what is committed); any other caller only meets it (waltz_storage.rules)."""
    rules.admit_caller(caller, kind, offline, partition.partition_id)
    if offline:
        # Offline recovery repairs a partition nobody writes to; it cannot hold a live session's id.
        if partition.writable:
            raise protocol.OfflineNotAllowed(
                f"partition {partition.partition_id}: offline requests are accepted only while the partition "
                f"is unwritable; mark it unwritable first"
            )
        return
    if kind in READS:
        partition.check_readable()
    elif kind in WRITES:
        partition.check_writable()
    if caller.server:
        partition.fence.admit(session_id)
    else:
        partition.fence.check(session_id)


class RequestExecutor:
    """Turns requests into responses; never raises. Call it for a partition only where that partition's work
    runs at the time: on its thread, or on the loop while no thread has work (StorageNode.serve)."""

    def __init__(self, manager: StorageManager, limits: Limits, metrics: StorageMetrics) -> None:
        self.manager = manager
        self.limits = limits
        self.metrics = metrics
        self.write_failures = WriteFailures()

    def execute(self, kind: str, msg: Any, caller: rules.Caller = rules.PLAINTEXT) -> storage_pb2.StorageResponse:
        """Answer one request (any kind but open) of caller; a Failure for anything that goes wrong."""
        try:
            partition = self.manager.partition(msg.partition_id)
            admit(partition, kind, msg.session_id, getattr(msg, "offline", False), caller)
            response = getattr(self, "_" + kind)(partition, msg)
        except Exception as e:
            if kind in WRITES and is_disk_failure(e):
                self.write_failures.failed(msg.partition_id, e)
            return self.failure(msg, e)
        if kind == "append":  # only data written and synced proves the disk takes writes again (not a truncate)
            self.write_failures.succeeded(msg.partition_id)
        return response

    def execute_appends(
        self, msgs: Sequence[storage_pb2.StorageAppendRequest], caller: rules.Caller = rules.PLAINTEXT
    ) -> list[storage_pb2.StorageResponse]:
        """Group commit: consecutive appends of one session written with one fdatasync, answered alike.

        If the combined batch is refused, each append is retried alone, so every request gets the
        answer it would have had on its own (the engine writes nothing of a refused batch).
        """
        if len(msgs) == 1:
            return [self.execute("append", msgs[0], caller)]
        first = msgs[0]
        try:
            partition = self.manager.partition(first.partition_id)
            admit(partition, "append", first.session_id, first.offline, caller)
            self._write(partition, msgs)
        except Exception:
            return [self.execute("append", m, caller) for m in msgs]
        self.write_failures.succeeded(first.partition_id)
        return [protocol.success(m.session_id, m.seq_num, m.partition_id) for m in msgs]

    def serve(self, run: Sequence[StreamRequest]) -> Iterator[Answers]:
        """Carry out stream requests queued together, in order, yielding the answers of each group as soon as
        it is done: consecutive appends of one stream and session share one write and fdatasync (up to
        MAX_GROUP_REQUESTS and max_batch_bytes); any other request is a group of its own."""
        i = 0
        while i < len(run):
            first = run[i]
            end = i + 1
            if first.kind == "append" and end < len(run):  # sized only when there is more to merge
                size = _batch_bytes(first.msg)
                while end < len(run) and end - i < MAX_GROUP_REQUESTS and _mergeable(first, run[end]):
                    size += _batch_bytes(run[end].msg)
                    if size > self.limits.max_batch_bytes:
                        break
                    end += 1
            msgs = [r.msg for r in run[i:end]]
            try:
                responses = (
                    self.execute_appends(msgs, first.caller)
                    if first.kind == "append"
                    else [self.execute(first.kind, first.msg, first.caller)]
                )
            except Exception as e:  # neither raises; should they, the stream still gets an answer to each
                responses = [self.failure(m, e) for m in msgs]
            yield Answers(first.stream, first.msg.partition_id, responses)
            i = end

    # ------------------------------------------------------------------ helpers

    def failure(self, msg: Any, exc: Exception) -> storage_pb2.StorageResponse:
        """A counted Failure echoing msg's ids (all -1 when there is no message)."""
        session_id, seq_num, partition_id = (
            (msg.session_id, msg.seq_num, msg.partition_id) if msg is not None else (-1, -1, -1)
        )
        code = protocol.error_code(exc)
        if code == protocol.Code.ERROR_CODE_UNSPECIFIED:
            log.error("partition %d: unexpected error", partition_id, exc_info=exc)
        elif code in (protocol.Code.IO_ERROR, protocol.Code.CORRUPTED):
            log.error("partition %d: %s", partition_id, exc)
        self.metrics.request_failures.labels(protocol.Code.Name(code)).inc()  # type: ignore[arg-type]
        return protocol.failure(session_id, seq_num, partition_id, exc)

    def _write(self, partition: StoragePartition, msgs: Sequence[storage_pb2.StorageAppendRequest]) -> None:
        """Append the requests' records as one batch with one fdatasync; raise what is wrong with them."""
        batch = encode_appends(msgs, partition.max_transaction_id + 1, partition.settings.max_record_size)
        if batch is None:  # something is wrong: the checked path names it (and encodes, should it find nothing)
            batch = partition.encode_checked([r for m in msgs for r in protocol.records_from_append(m)])
        started = time.perf_counter()
        partition.append_batch(batch)
        for m in msgs:  # after the write: what the server says is committed is capped at what is held
            if m.HasField("committed_high_water_mark"):
                partition.note_committed(m.committed_high_water_mark)
        seconds = time.perf_counter() - started if batch.record_count else None
        self.metrics.appended(len(msgs), batch.record_count, len(batch.data), seconds)

    def _list_length(self, msg: Any) -> int:
        protocol.check_list_request(msg.transaction_id, msg.max_records)
        return min(msg.max_records, self.limits.max_list_length)

    def read_fields(self, partition: StoragePartition, txn: int, max_n: int) -> list[RecordFields]:
        """Up to max_n records from txn (capped at max_list_length) within max_batch_bytes, at least one."""
        protocol.check_list_request(txn, max_n)
        return partition.record_fields(txn, min(max_n, self.limits.max_list_length), self.limits.max_batch_bytes)

    # ------------------------------------------------------------------ one method per request kind

    def _last_session_info(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        info = p.last_session_info()
        return storage_pb2.StorageResponse(
            last_session_info=storage_pb2.LastSessionInfoResponse(
                session_id=m.session_id,
                seq_num=m.seq_num,
                partition_id=m.partition_id,
                last_session_id=info.session_id,
                low_water_mark=info.low_water_mark,
                local_low_water_mark=info.local_low_water_mark,
                committed_high_water_mark=p.committed_high_water_mark,
            )
        )

    def _max_txn(self, m: Any, transaction_id: int, damaged: list[int] | None = None) -> storage_pb2.StorageResponse:
        return storage_pb2.StorageResponse(
            max_transaction_id=storage_pb2.MaxTransactionIdResponse(
                session_id=m.session_id,
                seq_num=m.seq_num,
                partition_id=m.partition_id,
                transaction_id=transaction_id,
                damaged_transaction_ids=(damaged or [])[:MAX_DAMAGED_LISTED],
            )
        )

    def _max_transaction_id(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        return self._max_txn(m, p.max_transaction_id, p.damaged_transaction_ids)

    def _repair(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        repaired = p.repair([protocol.record_from_proto(r) for r in m.records])
        self.metrics.records_repaired.inc(repaired)
        return self._max_txn(m, p.max_transaction_id, p.damaged_transaction_ids)

    def _truncate(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        if m.transaction_id < -1:
            raise InvalidRequest(f"cannot truncate to transaction {m.transaction_id} (-1 empties the partition)")
        return self._max_txn(m, p.truncate_checked(m.transaction_id, m.offline), p.damaged_transaction_ids)

    def _set_low_water_mark(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        if m.low_water_mark < -1:
            raise InvalidRequest(f"low-water mark {m.low_water_mark} is below -1")
        p.set_low_water_mark(m.session_id, m.low_water_mark, m.offline)
        return protocol.success(m.session_id, m.seq_num, m.partition_id)

    def _append(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        self._write(p, (m,))
        return protocol.success(m.session_id, m.seq_num, m.partition_id)

    def _record_header(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        protocol.check_list_request(m.transaction_id, 1)
        header = p.record_header(m.transaction_id)
        response = storage_pb2.RecordHeaderResponse(
            session_id=m.session_id, seq_num=m.seq_num, partition_id=m.partition_id
        )
        if header is not None:
            response.record_header.CopyFrom(protocol.header_to_proto(header))
        return storage_pb2.StorageResponse(record_header=response)

    def _record(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        protocol.check_list_request(m.transaction_id, 1)
        record = p.record(m.transaction_id)
        response = storage_pb2.RecordResponse(session_id=m.session_id, seq_num=m.seq_num, partition_id=m.partition_id)
        if record is not None:
            response.record.CopyFrom(protocol.record_to_proto(record))
        return storage_pb2.StorageResponse(record=response)

    def _record_header_list(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        headers = p.header_fields(m.transaction_id, self._list_length(m))
        response = storage_pb2.StorageResponse(
            record_header_list=storage_pb2.RecordHeaderListResponse(
                session_id=m.session_id,
                seq_num=m.seq_num,
                partition_id=m.partition_id,
                record_header_list_length=len(headers),
            )
        )
        protocol.add_headers(response.record_header_list.record_headers, headers)  # in place: no message copies
        return response

    def _record_list(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        if m.raw:
            return self._record_run(p, m)
        records = self.read_fields(p, m.transaction_id, m.max_records)
        response = storage_pb2.StorageResponse(
            record_list=storage_pb2.RecordListResponse(
                session_id=m.session_id, seq_num=m.seq_num, partition_id=m.partition_id, record_list_length=len(records)
            )
        )
        protocol.add_records(response.record_list.records, records)  # in place: no message copies
        return response

    def _record_run(self, p: StoragePartition, m: Any) -> storage_pb2.StorageResponse:
        """The records read_fields would give, as the data files hold them: no message and no tuple per record."""
        protocol.check_list_request(m.transaction_id, m.max_records)
        count, records, ends = p.record_run(
            m.transaction_id, min(m.max_records, self.limits.max_list_length), self.limits.max_batch_bytes
        )
        response = storage_pb2.StorageResponse()
        answer = response.record_list
        answer.session_id = m.session_id
        answer.seq_num = m.seq_num
        answer.partition_id = m.partition_id
        answer.record_list_length = count
        run = answer.run
        run.SetInParent()  # present even when empty: a node that serves runs answers with one
        run.first_transaction_id = m.transaction_id
        run.count = count
        run.records = records
        run.ends = ends
        return response
