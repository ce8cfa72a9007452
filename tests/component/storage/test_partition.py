"""StoragePartition on real files: append rules, segment rolls, truncation, low-water mark and flags."""

import json
import struct

import pytest

from tests.component.storage.helpers import make_record, make_records, open_manager, snapshot
from waltz_common.types import Record, ReqId, crc32
from waltz_storage.codec import FILE_HEADER_SIZE, RECORD_OVERHEAD, encode_record
from waltz_storage.errors import (
    BatchTooLarge,
    ChecksumError,
    CommittedDataError,
    DataChecksumMismatch,
    DirtyDataError,
    InvalidRequest,
    NonConsecutiveTransactionId,
    PartitionNotReadable,
    PartitionNotWritable,
    RecordTooLarge,
    StaleSession,
)
from waltz_storage.partition import SessionInfo


def segment_names(directory):
    return sorted(p.name for p in (directory / "0").glob("*.seg"))


def test_append_and_read(tmp_path):
    with open_manager(tmp_path) as manager:
        partition = manager.assign(0)
        assert partition.max_transaction_id == -1
        assert partition.record(0) is None
        assert partition.append(make_records(0, 3)) == 2
        assert partition.append([]) == 2
        assert partition.append(make_records(3, 2)) == 4
        assert partition.record(3) == make_record(3)
        assert partition.record_header(4) == make_record(4).record_header
        assert partition.records(3, 10) == make_records(3, 2)
        assert partition.record_headers(1, 2) == [r.record_header for r in make_records(1, 2)]
        assert partition.records(5, 10) == [] and partition.record_headers(-1, 3) == []
        assert partition.records(0, 0) == []


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (make_record(4), NonConsecutiveTransactionId, "record 2 of the batch has transaction id 4, expected 5"),
        (Record(5, ReqId(1, 1, 0, 1), 0, b"abc", 1), DataChecksumMismatch, "not the CRC32 of its data"),
        (make_record(5, size=101), RecordTooLarge, "101 data bytes exceed the maximum 100"),
        (Record(5, ReqId(2**31, 1, 0, 1), 0, b"", crc32(b"")), InvalidRequest, "client id"),
    ],
)
def test_bad_batch_is_rejected_with_nothing_written(tmp_path, bad, error, message):
    with open_manager(tmp_path, max_record_size=100) as manager:
        partition = manager.assign(0)
        partition.append(make_records(0, 3))
        before = snapshot(tmp_path / "0")
        with pytest.raises(error, match=message):
            partition.append([*make_records(3, 2), bad])
        assert partition.max_transaction_id == 2
        assert snapshot(tmp_path / "0") == before
        assert partition.append(make_records(3, 1)) == 3


def test_oversized_batch_is_rejected(tmp_path):
    with open_manager(tmp_path, max_batch_bytes=3 * (RECORD_OVERHEAD + 20)) as manager:
        partition = manager.assign(0)
        partition.append(make_records(0, 3))
        with pytest.raises(BatchTooLarge, match="batch of 240 bytes exceeds the maximum 180"):
            partition.append(make_records(3, 4))
        assert partition.max_transaction_id == 2


def test_segments_roll_at_the_threshold_and_reopen(tmp_path):
    record_size = RECORD_OVERHEAD + 60
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size) as manager:
        partition = manager.assign(0)
        for txn in range(10):
            partition.append([make_record(txn, 60)])
        # A segment takes records until its data file exceeds the threshold: 4 records each.
        assert segment_names(tmp_path) == [f"{first:019d}.seg" for first in (0, 4, 8)]
        assert (tmp_path / "0" / f"{4:019d}.seg").stat().st_size == 128 + 4 * record_size
        assert partition.records(0, 100) == make_records(0, 10, 60)
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size, segment_cache_capacity=1) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id == 9
        assert partition.records(2, 7) == make_records(2, 7, 60)
        assert [partition.record(t) for t in (9, 0, 5, 1)] == [make_record(t, 60) for t in (9, 0, 5, 1)]
        assert partition.append([make_record(10, 60)]) == 10


def as_fields(records):
    fields = []
    for r in records:
        q = r.req_id
        fields.append(
            (r.transaction_id, q.client_id, q.generation, q.partition_id, q.seq_num, r.header, r.data, r.checksum)
        )
    return fields


@pytest.mark.parametrize(
    ("start", "max_n", "max_bytes", "expected"),
    [
        (0, 100, 10_000, 10),  # across three segments
        (2, 5, 10_000, 5),
        (1, 100, 3 * (RECORD_OVERHEAD + 60), 3),  # exactly three records' bytes, across a segment boundary
        (1, 100, 3 * (RECORD_OVERHEAD + 60) - 1, 2),
        (3, 100, 1, 1),  # at least one, whatever its size
        (4, 100, 0, 1),
        (10, 100, 10_000, 0),
        (0, 0, 10_000, 0),
    ],
)
def test_record_fields_cap_by_count_and_bytes_across_segments(tmp_path, start, max_n, max_bytes, expected):
    record_size = RECORD_OVERHEAD + 60
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size) as manager:
        partition = manager.assign(0)
        for txn in range(10):
            partition.append([make_record(txn, 60)])
        got = partition.record_fields(start, max_n, max_bytes)
        assert got == as_fields(make_records(start, expected, 60))
        count, records, ends = partition.record_run(start, max_n, max_bytes)  # the same records, not decoded
        blobs = [encode_record(r) for r in make_records(start, expected, 60)]
        assert (count, records) == (expected, b"".join(blobs))
        assert ends == struct.pack(f"<{expected}I", *[record_size * (i + 1) for i in range(expected)])


@pytest.mark.parametrize("size", [60, 5000])  # one read of the range, or one per record's prefix
def test_record_headers_across_segments(tmp_path, size):
    record_size = RECORD_OVERHEAD + size
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size, max_record_size=size) as manager:
        partition = manager.assign(0)
        for txn in range(10):
            partition.append([make_record(txn, size)])
        assert partition.record_headers(1, 100) == [r.record_header for r in make_records(1, 9, size)]
        assert partition.header_fields(2, 3) == [f[:6] for f in as_fields(make_records(2, 3, size))]
        assert partition.record_headers(10, 5) == []


def test_a_damaged_record_fails_the_read_loudly(tmp_path):
    with open_manager(tmp_path) as manager:
        partition = manager.assign(0)
        partition.append(make_records(0, 10))
        data_file = tmp_path / "0" / f"{0:019d}.seg"
        damaged = bytearray(data_file.read_bytes())
        damaged[FILE_HEADER_SIZE + 4 * (RECORD_OVERHEAD + 20) + 40] ^= 0x01  # a data byte of record 4
        data_file.write_bytes(bytes(damaged))
        assert partition.records(0, 4) == make_records(0, 4)
        for read in (
            lambda: partition.records(0, 10),
            lambda: partition.record_fields(2, 5, 10_000),
            lambda: partition.record_run(2, 5, 10_000),
            lambda: partition.record(4),
        ):
            with pytest.raises(ChecksumError, match=f"{data_file}: record at offset .*: record checksum"):
                read()
        assert partition.records(5, 10) == make_records(5, 5)


@pytest.mark.parametrize(
    ("keep", "segments_left"), [(5, 2), (3, 2), (2, 1), (7, 3), (-1, 1), (-5, 1), (11, 3), (20, 3)]
)
def test_truncate_across_segments(tmp_path, keep, segments_left):
    """Segments hold 0-3, 4-7, 8-11; the segment holding keep + 1 is cut (possibly to empty), later ones go."""
    record_size = RECORD_OVERHEAD + 60
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size) as manager:
        partition = manager.assign(0)
        for txn in range(12):
            partition.append([make_record(txn, 60)])
        expected_max = min(max(keep, -1), 11)
        assert partition.truncate(keep) == expected_max
        assert len(segment_names(tmp_path)) == segments_left
        assert partition.records(0, 100) == make_records(0, expected_max + 1, 60)
        assert partition.record(expected_max + 1) is None
        assert partition.append([make_record(expected_max + 1, 60)]) == expected_max + 1
    with open_manager(tmp_path, segment_size_threshold=128 + 3 * record_size) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id == expected_max + 1
        assert partition.records(0, 100) == make_records(0, expected_max + 2, 60)


def test_set_low_water_mark_rules(tmp_path):
    with open_manager(tmp_path) as manager:
        partition = manager.assign(0)
        assert partition.last_session_info() == SessionInfo(-1, -1, -1)
        partition.append(make_records(0, 10))
        with pytest.raises(DirtyDataError, match="max transaction id 9 is above the low-water mark 7"):
            partition.set_low_water_mark(3, 7)
        assert partition.last_session_info() == SessionInfo(-1, -1, -1)
        partition.truncate(7)
        partition.set_low_water_mark(3, 7)
        assert partition.last_session_info() == SessionInfo(3, 7, 7)
        partition.truncate(4)
        # issue 44: above what the replica holds, as a previous-release server sets it before it copies the
        # replica up; recorded as it stands, the max as its local low-water mark
        partition.set_low_water_mark(5, 12)
        assert partition.last_session_info() == SessionInfo(5, 12, 4)
        with pytest.raises(CommittedDataError, match="refusing to truncate to 3"):
            partition.truncate_checked(3, offline=False)
        partition.append(make_records(5, 8))
        partition.set_low_water_mark(5, 12)
        assert partition.last_session_info() == SessionInfo(5, 12, 12)
        with pytest.raises(StaleSession, match="stale session 4, partition 0 is at session 5"):
            partition.set_low_water_mark(4, 20)
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.last_session_info() == SessionInfo(5, 12, 12)
        assert partition.fence.highest_session_id == 5
        with pytest.raises(StaleSession):
            partition.fence.check(4)


def test_a_low_water_mark_the_replica_never_reached_comes_down_to_its_max_and_survives_a_restart(tmp_path):
    """Issue 33's poisoned mark (10^6 on a replica holding 4) no longer refuses every later session: the next one,
    which copies the replica up first, sets its own mark; never below what the replica holds."""
    with open_manager(tmp_path) as manager:
        partition = manager.assign(0)
        partition.append(make_records(0, 5))
        partition.set_low_water_mark(2, 10**6)
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.last_session_info() == SessionInfo(2, 10**6, 4)
        with pytest.raises(CommittedDataError, match=r"refusing low-water mark 3: .* never goes below 4"):
            partition.set_low_water_mark(3, 3, offline=False)
        with pytest.raises(CommittedDataError, match="refusing to truncate to 3"):
            partition.truncate_checked(3, offline=False)
        partition.append(make_records(5, 3))
        partition.set_low_water_mark(3, 7)
        assert partition.last_session_info() == SessionInfo(3, 7, 7)


def test_flags_live_in_a_sidecar_file(tmp_path):
    with open_manager(tmp_path) as manager:
        partition = manager.assign(0)
        assert partition.readable and partition.writable
        manager.set_writable(0, False)
        with pytest.raises(PartitionNotWritable):
            partition.check_writable()
        partition.check_readable()
        manager.set_readable(0, False)
        with pytest.raises(PartitionNotReadable):
            partition.check_readable()
    flags = json.loads((tmp_path / "0" / "partition.json").read_text())
    assert flags == {"partition_id": 0, "readable": False, "writable": False}
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert not partition.readable and not partition.writable
        manager.set_readable(0, True)
        assert partition.readable
