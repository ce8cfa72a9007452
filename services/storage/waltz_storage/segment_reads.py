"""A segment's reads of consecutive records: decoded (record_fields, records), as the data file holds them
(record_span, for raw reads) or their headers only (header_fields, record_headers). Segment's (a mixin: the files
and the index lookups are Segment's, declared here for the type checker)."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import TYPE_CHECKING

from waltz_common.types import Record, RecordHeader, ReqId
from waltz_storage.codec import (
    RECORD_PREFIX_SIZE,
    HeaderFields,
    RecordFields,
    check_records,
    decode_headers,
    decode_records,
)
from waltz_storage.errors import CorruptionError
from waltz_storage.fileutil import pread_upto

_HEADER_SPAN_PER_RECORD = 4096
"""Header reads take the whole range in one read while records average at most this many bytes, else one
read per record's prefix."""


class SegmentReads:
    data_path: Path
    _data_size: int

    if TYPE_CHECKING:
        def _fds(self) -> tuple[int, int]: ...

        def _count(self, txn: int, max_n: int) -> int: ...

        def _bounds(self, txn: int, n: int) -> list[int]: ...

    def _span(self, txn: int, max_n: int, max_bytes: int, at_least_one: bool) -> tuple[bytes, list[int]]:
        """The data file's bytes of up to max_n records from txn taking at most max_bytes (the first even past
        max_bytes if at_least_one), in one index read and one data read, and their offsets and the offset just
        past the last; (b"", []) for none."""
        n = self._count(txn, max_n)
        if n == 0:
            return b"", []
        offsets = self._bounds(txn, n)
        fit = bisect.bisect_right(offsets, offsets[0] + max_bytes) - 1
        if fit < n:
            if fit == 0 and not at_least_one:
                return b"", []
            del offsets[max(fit, 1) + 1 :]
        data_fd, _ = self._fds()
        return pread_upto(data_fd, offsets[-1] - offsets[0], offsets[0]), offsets

    def record_fields(
        self, txn: int, max_n: int, max_bytes: int, at_least_one: bool = True
    ) -> tuple[list[RecordFields], int]:
        """Up to max_n records from txn taking at most max_bytes on disk (fewer at the end of the segment),
        checksums verified, and the bytes they take; the first record even past max_bytes if at_least_one.

        One index read, one data read of the contiguous range, one decoding pass."""
        buf, offsets = self._span(txn, max_n, max_bytes, at_least_one)
        if not offsets:
            return [], 0
        try:
            return decode_records(buf, offsets, txn), offsets[-1] - offsets[0]
        except CorruptionError as e:
            raise type(e)(f"{self.data_path}: {e}") from e

    def record_span(self, txn: int, max_n: int, max_bytes: int, at_least_one: bool = True) -> tuple[bytes, list[int]]:
        """record_fields' records as the data file holds them, checked (codec.check_records) but not decoded,
        with their offsets and the offset just past the last; (b"", []) for none."""
        buf, offsets = self._span(txn, max_n, max_bytes, at_least_one)
        if offsets:
            try:
                check_records(buf, offsets, txn)
            except CorruptionError as e:
                raise type(e)(f"{self.data_path}: {e}") from e
        return buf, offsets

    def records(self, txn: int, max_n: int) -> list[Record]:
        """Up to max_n records from txn (fewer at the end of the segment), checksums verified."""
        return [
            Record(t, ReqId(client_id, generation, partition_id, seq_num), header, data, checksum)
            for t, client_id, generation, partition_id, seq_num, header, data, checksum in self.record_fields(
                txn, max_n, self._data_size
            )[0]
        ]

    def header_fields(self, txn: int, max_n: int) -> list[HeaderFields]:
        """Up to max_n record headers from txn, read without the data."""
        n = self._count(txn, max_n)
        if n == 0:
            return []
        offsets = self._bounds(txn, n)
        data_fd, _ = self._fds()
        base, span = offsets[0], offsets[-1] - offsets[0]
        if span <= n * _HEADER_SPAN_PER_RECORD:
            prefixes = pread_upto(data_fd, span, base)
            positions = [offset - base for offset in offsets[:-1]]
        else:
            prefixes = b"".join([pread_upto(data_fd, RECORD_PREFIX_SIZE, offset) for offset in offsets[:-1]])
            positions = list(range(0, n * RECORD_PREFIX_SIZE, RECORD_PREFIX_SIZE))
            if len(prefixes) < n * RECORD_PREFIX_SIZE:  # the file ends inside a prefix: find which
                positions = [min(p, len(prefixes)) for p in positions]
        try:
            return decode_headers(prefixes, positions, offsets, txn)
        except CorruptionError as e:
            raise type(e)(f"{self.data_path}: {e}") from e

    def record_headers(self, txn: int, max_n: int) -> list[RecordHeader]:
        """Up to max_n record headers from txn, read without the data."""
        return [
            RecordHeader(t, ReqId(client_id, generation, partition_id, seq_num), header)
            for t, client_id, generation, partition_id, seq_num, header in self.header_fields(txn, max_n)
        ]
