"""A storage partition: its sorted segments, append/read/truncate, low-water mark and admin flags."""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from waltz_common.record_layout import RECORD_PREFIX
from waltz_common.types import Record, RecordHeader
from waltz_storage import rules
from waltz_storage.batch import EncodedBatch, encode_records
from waltz_storage.codec import (
    FRESH_PARTITION_INFO,
    HeaderFields,
    PartitionInfoStruct,
    RecordFields,
    check_record,
    join_spans,
)
from waltz_storage.control_file import ControlFile
from waltz_storage.errors import (
    BatchTooLarge,
    CorruptionError,
    DirtyDataError,
    InvalidRequest,
    NonConsecutiveTransactionId,
    PartitionNotReadable,
    PartitionNotWritable,
    StorageError,
)
from waltz_storage.fence import SessionFence
from waltz_storage.fileutil import fsync_dir, remove_stale_tmp_files, write_file_atomic
from waltz_storage.repair import DamageRepair
from waltz_storage.segment import DATA_SUFFIX, INDEX_SUFFIX, Segment, segment_paths

FLAGS_FILE_NAME = "partition.json"

DEFAULT_SEGMENT_SIZE_THRESHOLD = 1_000_000_000
DEFAULT_MAX_RECORD_SIZE = 4 * 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_SEGMENT_CACHE_CAPACITY = 5

T = TypeVar("T")
ReadSpan = Callable[[Segment, int, int, int, bool], tuple[T, int, int]]
"""Reads records of one segment: (segment, first id, at most how many, about how many bytes, at least one) to
(what was read, how many records, how many bytes on disk)."""

log = logging.getLogger(__name__)


def _fields_of(
    segment: Segment, txn: int, max_n: int, max_bytes: int, at_least_one: bool
) -> tuple[list[RecordFields], int, int]:
    fields, size = segment.record_fields(txn, max_n, max_bytes, at_least_one)
    return fields, len(fields), size


def _span_of(
    segment: Segment, txn: int, max_n: int, max_bytes: int, at_least_one: bool
) -> tuple[tuple[bytes, list[int]], int, int]:
    buf, offsets = segment.record_span(txn, max_n, max_bytes, at_least_one)
    return (buf, offsets), max(len(offsets) - 1, 0), len(buf)


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """Limits shared by every partition of a storage node."""

    segment_size_threshold: int = DEFAULT_SEGMENT_SIZE_THRESHOLD
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE  # data bytes of one record
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES  # encoded bytes of one append
    segment_cache_capacity: int = DEFAULT_SEGMENT_CACHE_CAPACITY  # sealed segments whose files stay open


class SessionInfo(NamedTuple):
    """The last store session recorded in the control file."""

    session_id: int
    low_water_mark: int
    local_low_water_mark: int


def _segment_firsts(directory: Path) -> list[int]:
    stems = (p.name[: -len(DATA_SUFFIX)] for p in directory.glob("*" + DATA_SUFFIX))
    return sorted(int(s) for s in stems if len(s) == 19 and s.isdigit())


def _write_flags(directory: Path, partition_id: int, readable: bool, writable: bool) -> None:
    body = {"partition_id": partition_id, "readable": readable, "writable": writable}
    write_file_atomic(directory / FLAGS_FILE_NAME, json.dumps(body).encode())


def remove_partition_files(directory: Path) -> None:
    """Unassign on disk: drop the flags file first (no longer assigned), then everything else."""
    (directory / FLAGS_FILE_NAME).unlink(missing_ok=True)
    if directory.exists():
        fsync_dir(directory)
        shutil.rmtree(directory)
        fsync_dir(directory.parent)


class StoragePartition(DamageRepair):
    """One assigned partition on this storage node; not thread-safe (serialise calls per partition)."""

    def __init__(
        self,
        partition_id: int,
        directory: Path,
        cluster_key: uuid.UUID,
        control_file: ControlFile,
        settings: PartitionSettings,
        segments: list[Segment],
        flags: dict[str, bool],
    ):
        self.partition_id = partition_id
        self.directory = directory
        self.settings = settings
        self._cluster_key = cluster_key
        self._control = control_file
        self._segments = segments
        self._firsts = [s.first_transaction_id for s in segments]
        self._open_sealed: OrderedDict[int, Segment] = OrderedDict()
        self._readable = flags["readable"]
        self._writable = flags["writable"]
        self._closed = False
        self.fence = SessionFence(partition_id, control_file.partition_info(partition_id).session_id)
        # The highest committed high-water mark an append told this node (capped at what it held then); in
        # memory only: after a restart the low-water mark is the floor until an append tells it again.
        self._told_committed = -1
        self.damage_found = sum(len(s.damaged) for s in segments)
        """Records found damaged since the partition opened (plain int: read by the metrics thread)."""

    @classmethod
    def create(
        cls,
        directory: Path,
        partition_id: int,
        cluster_key: uuid.UUID,
        control_file: ControlFile,
        settings: PartitionSettings,
    ) -> StoragePartition:
        """Assign on disk: fresh session info, an empty first segment, then the flags file last."""
        try:
            fresh = control_file.partition_info(partition_id) == FRESH_PARTITION_INFO
        except CorruptionError:
            fresh = False
        if not fresh:
            control_file.reset_partition_info(partition_id)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        Segment.create(directory, cluster_key, partition_id, 0).close()
        _write_flags(directory, partition_id, readable=True, writable=True)
        fsync_dir(directory.parent)
        return cls.open(directory, partition_id, cluster_key, control_file, settings)

    @classmethod
    def open(
        cls,
        directory: Path,
        partition_id: int,
        cluster_key: uuid.UUID,
        control_file: ControlFile,
        settings: PartitionSettings,
    ) -> StoragePartition:
        """Open an assigned partition, recovering each segment and dropping any after a gap in ids."""
        control_file.partition_info(partition_id)
        try:
            flags = json.loads((directory / FLAGS_FILE_NAME).read_text())
        except (OSError, ValueError) as e:
            raise CorruptionError(f"partition {partition_id}: cannot read {FLAGS_FILE_NAME}: {e}") from e
        remove_stale_tmp_files(directory)
        firsts = _segment_firsts(directory) or [0]
        for index in directory.glob("*" + INDEX_SUFFIX):
            if not index.with_suffix(DATA_SUFFIX).exists():
                index.unlink()
        segments: list[Segment] = []
        try:
            for i, first in enumerate(firsts):
                if segments and first != segments[-1].max_transaction_id + 1:
                    log.error(
                        "partition %d: segment %d does not follow transaction %d; dropping it and later ones",
                        partition_id,
                        first,
                        segments[-1].max_transaction_id,
                    )
                    for later in reversed(firsts[i:]):
                        for path in segment_paths(directory, later)[::-1]:
                            path.unlink(missing_ok=True)
                    fsync_dir(directory)
                    break
                if segments:
                    segments[-1].close()
                if first == 0 and not segment_paths(directory, 0)[0].exists():
                    segments.append(Segment.create(directory, cluster_key, partition_id, 0))
                else:
                    segments.append(Segment.open(directory, first, cluster_key, partition_id))
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        return cls(partition_id, directory, cluster_key, control_file, settings, segments, flags)

    # ------------------------------------------------------------------ state and flags

    @property
    def max_transaction_id(self) -> int:
        """The highest stored transaction id, -1 when empty."""
        return self._segments[-1].max_transaction_id

    @property
    def readable(self) -> bool:
        return self._readable

    @property
    def writable(self) -> bool:
        return self._writable

    def set_readable(self, readable: bool) -> None:
        _write_flags(self.directory, self.partition_id, readable, self._writable)
        self._readable = readable

    def set_writable(self, writable: bool) -> None:
        _write_flags(self.directory, self.partition_id, self._readable, writable)
        self._writable = writable

    def check_readable(self) -> None:
        if not self._readable:
            raise PartitionNotReadable(f"partition {self.partition_id} is not readable on this storage node")

    def check_writable(self) -> None:
        if not self._writable:
            raise PartitionNotWritable(f"partition {self.partition_id} is not writable on this storage node")

    def last_session_info(self) -> SessionInfo:
        info = self._control.partition_info(self.partition_id)
        return SessionInfo(info.session_id, info.low_water_mark, info.local_low_water_mark)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"partition {self.partition_id} is closed")

    # ------------------------------------------------------------------ writes

    def append(self, records: Sequence[Record]) -> int:
        """Durably append a batch continuing at max+1; the whole batch is rejected on any bad record."""
        return self.append_batch(self.encode_checked(records))

    def encode_checked(self, records: Sequence[Record]) -> EncodedBatch:
        """The records as a batch continuing at max+1; InvalidRequest naming the first bad record."""
        self._check_open()
        expected = self.max_transaction_id + 1
        for i, record in enumerate(records):
            if record.transaction_id != expected + i:
                raise NonConsecutiveTransactionId(
                    f"partition {self.partition_id}: record {i} of the batch has transaction id "
                    f"{record.transaction_id}, expected {expected + i}; nothing was written"
                )
            try:
                check_record(record, self.settings.max_record_size)
            except InvalidRequest as e:
                raise type(e)(f"partition {self.partition_id}: {e}; nothing was written") from None
        return encode_records(expected, records)

    def append_batch(self, batch: EncodedBatch) -> int:
        """Durably append records already checked and encoded (batch.encode_appends) continuing at max+1."""
        self._check_open()
        if len(batch.data) > self.settings.max_batch_bytes:
            raise BatchTooLarge(
                f"partition {self.partition_id}: batch of {len(batch.data)} bytes exceeds the maximum "
                f"{self.settings.max_batch_bytes}; nothing was written"
            )
        if batch.record_count and self._segments[-1].data_size > self.settings.segment_size_threshold:
            self._roll()
        self._segments[-1].append_batch(batch)
        return self.max_transaction_id

    def _roll(self) -> None:
        sealed = self._segments[-1]
        segment = Segment.create(self.directory, self._cluster_key, self.partition_id, sealed.max_transaction_id + 1)
        self._segments.append(segment)
        self._firsts.append(segment.first_transaction_id)
        self._cache(sealed)

    def truncate(self, transaction_id: int) -> int:
        """Durably drop every transaction after transaction_id; returns the new max transaction id."""
        self._check_open()
        if transaction_id >= self.max_transaction_id:
            return self.max_transaction_id
        keep = max(transaction_id, -1)
        index = max(0, bisect.bisect_right(self._firsts, keep + 1) - 1)
        later = self._segments[index + 1 :]
        for segment in reversed(later):
            self._open_sealed.pop(segment.first_transaction_id, None)
            segment.delete()
        if later:
            fsync_dir(self.directory)
        del self._segments[index + 1 :]
        del self._firsts[index + 1 :]
        self._open_sealed.pop(self._firsts[-1], None)
        self._segments[-1].truncate(keep)
        return self.max_transaction_id

    def note_committed(self, high_water_mark: int) -> None:
        """A session says every transaction up to high_water_mark is committed (held by a majority)."""
        self._told_committed = max(self._told_committed, min(high_water_mark, self.max_transaction_id))

    def truncation_floor(self, offline: bool) -> int:
        """The lowest transaction id a Truncate may keep (waltz_storage.rules)."""
        info = self.last_session_info()
        return rules.truncation_floor(info.low_water_mark, info.local_low_water_mark, self._told_committed, offline)

    @property
    def committed_high_water_mark(self) -> int:
        """The online truncation floor: what this node knows to be committed (-1: nothing)."""
        return self.truncation_floor(offline=False)

    def truncate_checked(self, transaction_id: int, offline: bool) -> int:
        """truncate, refused (CommittedDataError) below the truncation floor; returns the new max."""
        rules.check_truncate(self.partition_id, transaction_id, self.max_transaction_id, self.truncation_floor(offline))
        kept = self.truncate(transaction_id)
        self._told_committed = min(self._told_committed, kept)  # an offline repair may go below it
        return kept

    def reset_fence(self, session_id: int) -> None:
        """Clear a poisoned fence: only while unwritable, and only downwards; the control file follows."""
        self._check_open()
        if self._writable:
            raise PartitionNotWritable(
                f"partition {self.partition_id}: the fence is reset only while the partition is unwritable; "
                "mark it unwritable first"
            )
        if session_id < -1:
            raise InvalidRequest(f"session id {session_id} is below -1")
        if session_id >= self.fence.highest_session_id:
            raise InvalidRequest(
                f"partition {self.partition_id}: the fence is at session {self.fence.highest_session_id}, not above "
                f"{session_id}: nothing to reset"
            )
        info = self.last_session_info()
        if info.session_id > session_id:
            self._control.overwrite_partition_info(
                self.partition_id, PartitionInfoStruct(session_id, info.low_water_mark, info.local_low_water_mark)
            )
        self.fence.reset(session_id)
        log.warning("partition %d: session fence reset to %d by an operator", self.partition_id, session_id)

    def set_low_water_mark(self, session_id: int, low_water_mark: int, offline: bool = False) -> None:
        """Record the session's start in the control file and raise the fence to it; the partition must hold
        nothing above it, and (online) the low-water mark never goes below what the partition holds of it. It may
        lie above the partition's max: a previous-release server sets it before it copies the replica up to it
        (waltz_storage.rules)."""
        self._check_open()
        self.fence.check(session_id)
        local = self.max_transaction_id
        if not offline:
            recorded = self.last_session_info().low_water_mark
            rules.check_low_water_mark(self.partition_id, low_water_mark, recorded, local)
        if local > low_water_mark:
            raise DirtyDataError(
                f"partition {self.partition_id}: max transaction id {local} is above the low-water mark "
                f"{low_water_mark}; dirty data must be truncated first"
            )
        self._control.set_partition_info(self.partition_id, PartitionInfoStruct(session_id, low_water_mark, local))
        self.fence.advance(session_id)

    # ------------------------------------------------------------------ reads

    def _cache(self, segment: Segment) -> None:
        """Keep a sealed segment's files open, closing the least recently used beyond the capacity."""
        if segment is self._segments[-1]:
            return
        self._open_sealed[segment.first_transaction_id] = segment
        self._open_sealed.move_to_end(segment.first_transaction_id)
        while len(self._open_sealed) > self.settings.segment_cache_capacity:
            _, evicted = self._open_sealed.popitem(last=False)
            evicted.close()

    def _segment_for(self, transaction_id: int) -> Segment | None:
        index = bisect.bisect_right(self._firsts, transaction_id) - 1
        if index < 0:
            return None
        segment = self._segments[index]
        self._cache(segment)
        return segment

    def _collect(self, transaction_id: int, max_n: int, fetch: Callable[[Segment, int, int], list[T]]) -> list[T]:
        self._check_open()
        result: list[T] = []
        while len(result) < max_n:
            segment = self._segment_for(transaction_id + len(result))
            try:
                got = fetch(segment, transaction_id + len(result), max_n - len(result)) if segment else []
            except CorruptionError:
                self._note_read_damage(transaction_id + len(result), max_n - len(result))
                raise
            if not got:
                break
            result.extend(got)
        return result

    def _read_spans(self, transaction_id: int, max_n: int, max_bytes: int, read: ReadSpan[T]) -> list[T]:
        """Up to max_n consecutive records from transaction_id taking at most max_bytes on disk (but at least one,
        whatever its size), read from each segment they lie in by read(segment, txn, n, bytes, at_least_one) (the
        part, how many records and how many bytes it holds); the parts, none past the end."""
        self._check_open()
        parts: list[T] = []
        count = 0
        budget = max_bytes
        while count < max_n:
            txn = transaction_id + count
            segment = self._segment_for(txn)
            if segment is None:
                break
            try:
                part, got, size = read(segment, txn, max_n - count, budget, not parts)
            except CorruptionError:
                self._note_read_damage(txn, max_n - count)
                raise
            if not got:
                break
            parts.append(part)
            count += got
            budget -= size
            if budget <= 0:
                break
        return parts

    def record_fields(self, transaction_id: int, max_n: int, max_bytes: int) -> list[RecordFields]:
        """Up to max_n consecutive records from transaction_id taking at most max_bytes on disk (but at least
        one, whatever its size), as plain values, checksums verified; shorter or empty past the end."""
        parts = self._read_spans(transaction_id, max_n, max_bytes, _fields_of)
        return parts[0] if len(parts) == 1 else [fields for part in parts for fields in part]

    def record_run(self, transaction_id: int, max_n: int, max_bytes: int) -> tuple[int, bytes, bytes]:
        """record_fields' records as a RecordRun (how many, their bytes as the data files hold them and their
        ends, codec.join_spans), each checked (codec.check_records) but none decoded."""
        spans = self._read_spans(transaction_id, max_n, max_bytes, _span_of)
        if not spans:
            return 0, b"", b""
        return sum(len(offsets) - 1 for _, offsets in spans), *join_spans(spans)

    def records(self, transaction_id: int, max_n: int) -> list[Record]:
        """Up to max_n consecutive records from transaction_id; shorter or empty past the end."""
        return self._collect(transaction_id, max_n, Segment.records)

    def record_headers(self, transaction_id: int, max_n: int) -> list[RecordHeader]:
        """Up to max_n consecutive record headers from transaction_id."""
        return self._collect(transaction_id, max_n, Segment.record_headers)

    def header_fields(self, transaction_id: int, max_n: int) -> list[HeaderFields]:
        """Up to max_n consecutive record headers from transaction_id, as plain values."""
        return self._collect(transaction_id, max_n, Segment.header_fields)

    def digest(self, transaction_id: int, max_n: int, max_bytes: int) -> tuple[int, bytes]:
        """How many consecutive records from transaction_id (at most max_n) and the SHA-256 over them, each as
        its fields (packed as the data file's RECORD_PREFIX) then its data; read max_bytes at a time, checksums
        verified."""
        digest = hashlib.sha256()
        count = 0
        while count < max_n:
            got = self.record_fields(transaction_id + count, max_n - count, max_bytes)
            if not got:
                break
            for txn, client_id, generation, pid, seq_num, header, data, checksum in got:
                digest.update(RECORD_PREFIX.pack(txn, client_id, generation, pid, seq_num, header, len(data), checksum))
                digest.update(data)
            count += len(got)
        return count, digest.digest()

    def record(self, transaction_id: int) -> Record | None:
        found = self.records(transaction_id, 1)
        return found[0] if found else None

    def record_header(self, transaction_id: int) -> RecordHeader | None:
        found = self.record_headers(transaction_id, 1)
        return found[0] if found else None

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._open_sealed.clear()
        self._closed = True
