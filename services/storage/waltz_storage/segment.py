"""One segment of a partition: the .seg data file and its .idx offset index, with crash recovery on open."""

from __future__ import annotations

import bisect
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from waltz_common.types import Record, crc32
from waltz_storage.batch import EncodedBatch, encode_records
from waltz_storage.codec import (
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    RECORD_PREFIX_SIZE,
    SegmentFileHeader,
    decode_index_entries,
    decode_record,
    decode_record_prefix,
    decode_records,
    encode_index_entries,
    encode_record,
    index_entry_offset,
)
from waltz_storage.errors import (
    CorruptionError,
    InvalidRequest,
    NonConsecutiveTransactionId,
    StorageError,
    TornRecordError,
)
from waltz_storage.fileutil import pread_upto, pwrite_all, write_file_atomic
from waltz_storage.segment_reads import SegmentReads

CHECKPOINT_INTERVAL = 1000
DATA_SUFFIX = ".seg"
INDEX_SUFFIX = ".idx"
_SCAN_CHUNK = 1 << 20
RESYNC_LOOKAHEAD = 64
"""How many index entries past a record that fails its checks the start-up scan tries, looking for an intact
successor (which proves the bad record lies inside written data: damage, not a torn tail)."""

log = logging.getLogger(__name__)


def segment_paths(directory: Path, first_transaction_id: int) -> tuple[Path, Path]:
    """The (.seg, .idx) paths of the segment starting at first_transaction_id."""
    stem = f"{first_transaction_id:019d}"
    return directory / (stem + DATA_SUFFIX), directory / (stem + INDEX_SUFFIX)


class _ChunkReader:
    """Serves byte ranges of the data file from large preads, never past data_size."""

    def __init__(self, fd: int, data_size: int):
        self._fd = fd
        self.size = data_size
        self._start = 0
        self._buf = b""

    def get(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        rel = offset - self._start
        if rel < 0 or rel + size > len(self._buf):
            self._start = offset
            self._buf = pread_upto(self._fd, max(size, _SCAN_CHUNK), offset)
            rel = 0
        return self._buf[rel : rel + size]


def _intact_at(reader: _ChunkReader, offset: int, txn: int) -> bool:
    try:
        _check_record_at(reader, offset, txn)
    except CorruptionError:
        return False
    return True


def _check_record_at(reader: _ChunkReader, offset: int, txn: int) -> int:
    """Validate the record that should hold txn at offset; return the offset just past it."""
    if offset < FILE_HEADER_SIZE:
        raise CorruptionError(f"record {txn}: offset {offset} lies inside the file header")
    prefix = decode_record_prefix(reader.get(offset, RECORD_PREFIX_SIZE), 0, offset)
    if offset + prefix.record_size > reader.size:
        raise TornRecordError(
            f"record at offset {offset}: needs {prefix.record_size} bytes (data length {prefix.data_length}), "
            f"only {reader.size - offset} present"
        )
    _, end = decode_record(reader.get(offset, prefix.record_size), 0, txn, offset)
    return offset + end


class Segment(SegmentReads):
    """A segment's open files; not thread-safe. Files are reopened on demand after close()."""

    def __init__(self, directory: Path, header: SegmentFileHeader, max_transaction_id: int, data_size: int):
        self.header = header
        self.first_transaction_id = header.first_transaction_id
        self.data_path, self.index_path = segment_paths(directory, header.first_transaction_id)
        self._max = max_transaction_id
        self._data_size = data_size
        self._data_fd: int | None = None
        self._index_fd: int | None = None
        self.damaged: set[int] = set()
        """Ids of records here that fail their checks but lie inside written data (found at start, by a read
        or by scrubbing): kept in place, reported, answered CORRUPTED, until repair() rewrites them."""

    @classmethod
    def create(cls, directory: Path, cluster_key: uuid.UUID, partition_id: int, first_transaction_id: int) -> Segment:
        """Create an empty segment; each file appears complete with its header or not at all."""
        header = SegmentFileHeader(
            FORMAT_VERSION, time.time_ns() // 1_000_000, cluster_key, partition_id, first_transaction_id
        )
        data_path, index_path = segment_paths(directory, first_transaction_id)
        write_file_atomic(index_path, header.encode(), sync_dir=False)
        write_file_atomic(data_path, header.encode())
        return cls(directory, header, first_transaction_id - 1, FILE_HEADER_SIZE)

    @classmethod
    def open(cls, directory: Path, first_transaction_id: int, cluster_key: uuid.UUID, partition_id: int) -> Segment:
        """Open an existing segment, check its header and recover it to its last intact record."""
        data_path, _ = segment_paths(directory, first_transaction_id)
        with data_path.open("rb") as f:
            raw = f.read(FILE_HEADER_SIZE)
        if len(raw) < FILE_HEADER_SIZE:
            # A cut inside the header leaves no intact record: recover to an empty segment.
            log.warning("%s: header torn at %d bytes; recreating the segment empty", data_path, len(raw))
            return cls.create(directory, cluster_key, partition_id, first_transaction_id)
        header = SegmentFileHeader.decode(raw)
        header.check(cluster_key, partition_id, first_transaction_id, str(data_path))
        segment = cls(directory, header, first_transaction_id - 1, FILE_HEADER_SIZE)
        segment._recover()
        return segment

    # ------------------------------------------------------------------ state

    @property
    def max_transaction_id(self) -> int:
        """The last transaction id stored here; first_transaction_id - 1 when empty."""
        return self._max

    @property
    def data_size(self) -> int:
        return self._data_size

    def _fds(self) -> tuple[int, int]:
        if self._data_fd is None or self._index_fd is None:
            self.close()
            self._data_fd = os.open(self.data_path, os.O_RDWR)
            self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._data_fd, self._index_fd

    def close(self) -> None:
        """Close the files; later calls reopen them."""
        for fd in (self._data_fd, self._index_fd):
            if fd is not None:
                os.close(fd)
        self._data_fd = self._index_fd = None

    def delete(self) -> None:
        """Close and remove both files, the index first so a leftover .seg is still a valid segment."""
        self.close()
        self.index_path.unlink(missing_ok=True)
        self.data_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        data_fd, index_fd = self._fds()
        first = self.first_transaction_id
        data_size = os.fstat(data_fd).st_size
        index_header = pread_upto(index_fd, FILE_HEADER_SIZE, 0)
        changed = len(index_header) < FILE_HEADER_SIZE or SegmentFileHeader.decode(index_header) != self.header
        if changed:
            log.warning("%s: index header missing or damaged; rebuilding the index", self.index_path)
            os.ftruncate(index_fd, 0)
            pwrite_all(index_fd, self.header.encode(), 0)
        entries = (os.fstat(index_fd).st_size - FILE_HEADER_SIZE) // INDEX_ENTRY_SIZE
        reader = _ChunkReader(data_fd, data_size)
        start_txn, start_offset = self._scan_start(reader, entries)
        offsets, end = self._scan(reader, start_txn, start_offset, entries)
        last = start_txn + len(offsets) - 1
        position = index_entry_offset(first, start_txn)
        encoded = encode_index_entries(offsets)
        changed = changed or end != data_size or entries != last - first + 1
        if pread_upto(index_fd, len(encoded), position) != encoded:
            pwrite_all(index_fd, encoded, position)
            changed = True
        if changed:
            log.warning("%s: recovered to transaction %d (data %d -> %d bytes)", self.data_path, last, data_size, end)
            os.ftruncate(data_fd, end)
            os.ftruncate(index_fd, index_entry_offset(first, last + 1))
            os.fsync(data_fd)
            os.fsync(index_fd)
        self._max = last
        self._data_size = end

    def _scan_start(self, reader: _ChunkReader, entries: int) -> tuple[int, int]:
        """The latest index checkpoint whose entry points at its intact record, else the segment start."""
        first = self.first_transaction_id
        if entries <= 0:
            return first, FILE_HEADER_SIZE
        checkpoint = (first + entries - 1) // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL
        while checkpoint > first:
            (offset,) = self._index_entries(checkpoint, 1)
            try:
                _check_record_at(reader, offset, checkpoint)
                return checkpoint, offset
            except CorruptionError as e:
                log.warning("%s: index checkpoint %d unusable (%s)", self.index_path, checkpoint, e)
            checkpoint -= CHECKPOINT_INTERVAL
        return first, FILE_HEADER_SIZE

    def _scan(self, reader: _ChunkReader, txn: int, offset: int, entries: int) -> tuple[list[int], int]:
        """Offsets of the consecutive records from (txn, offset), and the offset after them.

        A record that fails its checks ends the scan only when no intact record follows it (a torn tail: the
        batch being written when the process died). When an intact successor follows, the bad records lie
        inside written data: they are damage, kept in place and listed in self.damaged, never cut."""
        offsets: list[int] = []
        while True:
            try:
                end = _check_record_at(reader, offset, txn)
            except CorruptionError as e:
                resumed = self._resync(reader, txn, offset, entries) if offset < reader.size else None
                if resumed is None:
                    if offset < reader.size:
                        log.warning("%s: torn tail at transaction %d: %s", self.data_path, txn, e)
                    return offsets, offset
                bad_offsets, offset = resumed
                bad = range(txn, txn + len(bad_offsets))
                log.error(
                    "%s: transactions %d..%d are damaged (%s); intact records follow, so they are kept and reported "
                    "as damaged for repair from another replica",
                    self.data_path,
                    bad[0],
                    bad[-1],
                    e,
                )
                self.damaged.update(bad)
                offsets.extend(bad_offsets)
                txn += len(bad_offsets)
                continue
            offsets.append(offset)
            offset = end
            txn += 1

    def _resync(self, reader: _ChunkReader, txn: int, offset: int, entries: int) -> tuple[list[int], int] | None:
        """After record txn at offset failed its checks: the offsets of txn.. up to an intact later record and
        that record's offset, or None when no intact successor is found (a torn tail)."""
        first = self.first_transaction_id
        try:
            prefix = decode_record_prefix(reader.get(offset, RECORD_PREFIX_SIZE), 0, offset)
            after = offset + prefix.record_size
            if after < reader.size and _intact_at(reader, after, txn + 1):
                return [offset], after
            if after == reader.size and txn - first < entries and self._index_entries(txn, 1) == [offset]:
                # The last record, whole by its own length and indexed: a batch's index entries are written only
                # after its data was written whole, so it was written (and acknowledged): damage, not a torn
                # tail. (A flip in the last record's length field looks like a torn write: that one is cut.)
                return [offset], after
        except CorruptionError:
            pass
        last_entry = min(first + entries - 1, txn + RESYNC_LOOKAHEAD)
        if last_entry <= txn:
            return None
        known = self._index_entries(txn, last_entry - txn + 1)
        if known[0] != offset:
            return None  # the index does not describe this stretch of the file
        for j in range(1, len(known)):
            if not known[j - 1] < known[j] < reader.size:
                return None
            if _intact_at(reader, known[j], txn + j):
                return known[:j], known[j]
        return None

    # ------------------------------------------------------------------ write

    def append(self, records: Sequence[Record]) -> None:
        """Durably append consecutive (checked) records: one data write and one fdatasync per batch."""
        start = self._max + 1
        for i, record in enumerate(records):
            if record.transaction_id != start + i:
                raise NonConsecutiveTransactionId(
                    f"{self.data_path}: expected transaction {start + i}, got {record.transaction_id}"
                )
        self.append_batch(encode_records(start, records))

    def append_batch(self, batch: EncodedBatch) -> None:
        """Durably append an encoded batch continuing at max+1: one data write and one fdatasync."""
        if not batch.record_count:
            return
        start = self._max + 1
        if batch.first_transaction_id != start:
            raise NonConsecutiveTransactionId(
                f"{self.data_path}: expected transaction {start}, got {batch.first_transaction_id}"
            )
        data_fd, index_fd = self._fds()
        base = self._data_size
        last = start + batch.record_count - 1
        entries = encode_index_entries(batch.offsets, base)
        try:
            pwrite_all(data_fd, batch.data, base)
            pwrite_all(index_fd, entries, index_entry_offset(self.first_transaction_id, start))
            os.fdatasync(data_fd)
            # The index is synced after the data, so a durable checkpoint entry never points at lost data.
            if last // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL >= start:
                os.fsync(index_fd)
        except OSError as e:
            self._undo(start)
            raise StorageError(f"{self.data_path}: append of {start}..{last} failed: {e}") from e
        self._max = last
        self._data_size = base + len(batch.data)

    def _undo(self, start: int) -> None:
        """Best effort: cut both files back to before a failed append."""
        try:
            data_fd, index_fd = self._fds()
            os.ftruncate(data_fd, self._data_size)
            os.ftruncate(index_fd, index_entry_offset(self.first_transaction_id, start))
        except OSError:
            log.exception("%s: could not undo a failed append", self.data_path)

    def truncate(self, transaction_id: int) -> None:
        """Durably drop every record after transaction_id."""
        keep = max(transaction_id, self.first_transaction_id - 1)
        if keep >= self._max:
            return
        data_fd, index_fd = self._fds()
        (new_size,) = self._index_entries(keep + 1, 1)
        os.ftruncate(data_fd, new_size)
        os.ftruncate(index_fd, index_entry_offset(self.first_transaction_id, keep + 1))
        os.fsync(data_fd)
        os.fsync(index_fd)
        self._max = keep
        self._data_size = new_size
        self.damaged = {t for t in self.damaged if t <= keep}

    def repair(self, record: Record) -> None:
        """Rewrite damaged record in place (one write, one fdatasync) with an intact copy from another replica.

        The copy must fit the damaged record's slot exactly and be the same record: its record checksum equals
        the one stored, or (should the stored checksum be the damaged bytes) its prefix, with the data checksum,
        equals the one stored. InvalidRequest with nothing written otherwise."""
        txn = record.transaction_id
        if txn not in self.damaged:
            raise InvalidRequest(f"{self.data_path}: transaction {txn} is not damaged here; nothing was written")
        if crc32(record.data) != record.checksum:  # raw reads rely on every written record's data matching it
            raise InvalidRequest(
                f"{self.data_path}: the copy of transaction {txn} has checksum {record.checksum}, not the CRC32 of "
                f"its data ({crc32(record.data)}); nothing was written"
            )
        raw = encode_record(record)
        start, end = self._bounds(txn, 1)
        data_fd, _ = self._fds()
        stored = pread_upto(data_fd, end - start, start)
        same = len(raw) == end - start and (
            raw[-4:] == stored[-4:] or raw[:RECORD_PREFIX_SIZE] == stored[:RECORD_PREFIX_SIZE]
        )
        if not same:
            raise InvalidRequest(
                f"{self.data_path}: the copy of transaction {txn} ({len(raw)} bytes) does not match the damaged "
                f"record's own checksums or size ({end - start} bytes); nothing was written"
            )
        try:
            pwrite_all(data_fd, raw, start)
            os.fdatasync(data_fd)
        except OSError as e:
            raise StorageError(f"{self.data_path}: repair of transaction {txn} failed: {e}") from e
        self.damaged.discard(txn)

    def find_damage(self, txn: int, max_n: int, max_bytes: int) -> tuple[int, int, list[int]]:
        """Check up to max_n records from txn (about max_bytes of them, at least one) one by one: how many were
        checked, the bytes read, and the ids that fail their checks (added to self.damaged)."""
        n = self._count(txn, max_n)
        if n == 0:
            return 0, 0, []
        offsets = self._bounds(txn, n)
        fit = max(1, bisect.bisect_right(offsets, offsets[0] + max_bytes) - 1)
        del offsets[fit + 1 :]
        data_fd, _ = self._fds()
        buf = pread_upto(data_fd, offsets[-1] - offsets[0], offsets[0])
        try:
            decode_records(buf, offsets, txn)  # the reads' one-pass check: cheap while nothing is wrong
            return len(offsets) - 1, len(buf), []
        except CorruptionError:
            pass
        found = []
        for i in range(len(offsets) - 1):
            start, end = offsets[i] - offsets[0], offsets[i + 1] - offsets[0]
            try:
                _, after = decode_record(buf[start:end], 0, txn + i, offsets[i])
                if after != end - start:
                    raise CorruptionError(f"record {txn + i} does not fill its slot")
            except CorruptionError:
                found.append(txn + i)
        self.damaged.update(found)
        return len(offsets) - 1, len(buf), found

    # ------------------------------------------------------------------ read

    def _index_entries(self, txn: int, count: int) -> list[int]:
        _, index_fd = self._fds()
        raw = pread_upto(index_fd, INDEX_ENTRY_SIZE * count, index_entry_offset(self.first_transaction_id, txn))
        if len(raw) < INDEX_ENTRY_SIZE * count:
            raise CorruptionError(f"{self.index_path}: index ends before transaction {txn + count - 1}")
        return decode_index_entries(raw)

    def _count(self, txn: int, max_n: int) -> int:
        if max_n <= 0 or txn < self.first_transaction_id or txn > self._max:
            return 0
        return min(max_n, self._max - txn + 1)

    def _bounds(self, txn: int, n: int) -> list[int]:
        """The n records' offsets from txn and the offset just past the last (n + 1 entries)."""
        if txn + n <= self._max:
            return self._index_entries(txn, n + 1)
        offsets = self._index_entries(txn, n)
        offsets.append(self._data_size)
        return offsets
