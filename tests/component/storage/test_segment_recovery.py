"""Crash recovery: cut or damage segment files, reopen, and find exactly the intact prefix."""

import struct

import pytest

from tests.component.storage.helpers import make_record, make_records, open_manager, restore, snapshot
from waltz_common.types import Record, crc32
from waltz_storage.codec import RECORD_OVERHEAD
from waltz_storage.errors import CorruptionError, InvalidRequest

N = 5
SIZE = 24  # a small last record keeps the every-byte loop to a few dozen reopenings
LENGTH_FIELD = range(28, 32)  # a record's data length (docs/storage-format.md)


def build(directory, n=N, size=SIZE, batch=1):
    with open_manager(directory) as manager:
        partition = manager.assign(0)
        for start in range(0, n, batch):
            partition.append(make_records(start, min(batch, n - start), size))
    seg = directory / "0" / f"{0:019d}.seg"
    return seg, seg.with_suffix(".idx")


def assert_intact(directory, expected_max, size=SIZE):
    """Every record up to expected_max reads back by id; the next append gets expected_max + 1."""
    with open_manager(directory) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id == expected_max
        assert partition.records(0, 10_000) == make_records(0, expected_max + 1, size)
        for txn in range(expected_max + 1):
            assert partition.record(txn) == make_record(txn, size)
        assert partition.record(expected_max + 1) is None
        assert partition.append([make_record(expected_max + 1, size)]) == expected_max + 1
        assert partition.record(expected_max + 1) == make_record(expected_max + 1, size)


def test_cut_data_file_at_every_byte_of_the_last_record(tmp_path):
    seg, idx = build(tmp_path)
    original = snapshot(tmp_path)
    record_size = RECORD_OVERHEAD + SIZE
    end = seg.stat().st_size
    assert end == 128 + N * record_size
    for cut in range(end - record_size, end):
        restore(original)
        seg.write_bytes(original[seg][:cut])
        assert_intact(tmp_path, N - 2)
        assert idx.stat().st_size == 128 + 8 * N  # index rebuilt and extended by the new append
    restore(original)
    assert_intact(tmp_path, N - 1)


def test_cut_inside_the_last_segment_file_header(tmp_path):
    with open_manager(tmp_path, segment_size_threshold=128 + 2 * (RECORD_OVERHEAD + SIZE)) as manager:
        partition = manager.assign(0)
        for txn in range(N):
            partition.append([make_record(txn, SIZE)])
    last = tmp_path / "0" / f"{3:019d}.seg"  # segments hold 0-2 and 3-4
    original = snapshot(tmp_path)
    for cut in range(129):
        restore(original)
        last.write_bytes(original[last][:cut])
        assert_intact(tmp_path, 2)
    restore(original)
    assert_intact(tmp_path, N - 1)


def test_cut_inside_the_only_segment_file_header(tmp_path):
    seg, _ = build(tmp_path)
    seg.write_bytes(seg.read_bytes()[:50])
    assert_intact(tmp_path, -1)


def test_cut_index_file_at_every_byte(tmp_path):
    _, idx = build(tmp_path)
    original = snapshot(tmp_path)
    for cut in range(128, 128 + 8 * N):
        restore(original)
        idx.write_bytes(original[idx][:cut])
        assert_intact(tmp_path, N - 1)
    for cut in (0, 5, 127):  # even a torn index header is rebuilt from the data file
        restore(original)
        idx.write_bytes(original[idx][:cut])
        assert_intact(tmp_path, N - 1)
    restore(original)
    idx.unlink()
    assert_intact(tmp_path, N - 1)


def assert_damaged(directory, damaged, expected_max=N - 1, size=SIZE):
    """Issue 33: the damaged record is kept in place and reported, never served; every record around it is kept
    and served; the next append follows the last record."""
    with open_manager(directory) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id == expected_max
        assert partition.damaged_transaction_ids == [damaged]
        for txn in range(expected_max + 1):
            if txn == damaged:
                with pytest.raises(CorruptionError):
                    partition.record(txn)
            else:
                assert partition.record(txn) == make_record(txn, size)
        assert partition.append([make_record(expected_max + 1, size)]) == expected_max + 1


@pytest.mark.parametrize("damaged", [0, 2, N - 1])
def test_a_flipped_byte_anywhere_in_a_written_record_is_damage_kept_and_reported_not_a_cut(tmp_path, damaged):
    """Every byte of a record inside the written data (the first, one in the middle, the last: its index entry is
    written only after its data was written whole), flipped in turn: before issue 33 the node cut its log there,
    and every intact record after it went too."""
    seg, _ = build(tmp_path)
    original = snapshot(tmp_path)
    record_size = RECORD_OVERHEAD + SIZE
    start = 128 + damaged * record_size
    for offset in range(start, start + record_size):
        if damaged == N - 1 and offset - start in LENGTH_FIELD:
            continue  # the last record's length damaged: it no longer ends at the file's end, as a torn write
        restore(original)
        data = bytearray(original[seg])
        data[offset] ^= 0x10
        seg.write_bytes(bytes(data))
        assert_damaged(tmp_path, damaged)


def test_a_torn_last_record_without_its_index_entry_is_cut(tmp_path):
    """The batch being written when the process died: its data is there (damaged) but its index entry is not."""
    seg, idx = build(tmp_path)
    record_size = RECORD_OVERHEAD + SIZE
    data = bytearray(seg.read_bytes())
    data[128 + (N - 1) * record_size + 40] ^= 0x10
    seg.write_bytes(bytes(data))
    idx.write_bytes(idx.read_bytes()[: 128 + 8 * (N - 1)])
    assert_intact(tmp_path, N - 2)


def test_a_damaged_record_is_repaired_only_with_a_copy_of_itself(tmp_path):
    seg, _ = build(tmp_path)
    record_size = RECORD_OVERHEAD + SIZE
    for at in (128 + 40, 128 + 2 * record_size + record_size - 1):  # the data of record 0, the checksum of record 2
        data = bytearray(seg.read_bytes())
        data[at] ^= 0x10
        seg.write_bytes(bytes(data))
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.damaged_transaction_ids == [0, 2]
        own = make_record(0, SIZE)
        other = Record(0, own.req_id, own.header, b"x" * SIZE, crc32(b"x" * SIZE))  # same size, other data
        with pytest.raises(InvalidRequest, match="does not match"):
            partition.repair([other])
        # Its own prefix (and so its data checksum) with other data: its record CRC would be made to hold.
        forged = Record(0, own.req_id, own.header, b"x" * SIZE, own.checksum)
        with pytest.raises(InvalidRequest, match="not the CRC32 of its data"):
            partition.repair([forged])
        with pytest.raises(InvalidRequest, match="not damaged"):
            partition.repair([make_record(1, SIZE)])
        assert partition.repair([make_record(0, SIZE), make_record(2, SIZE)]) == 2
        assert partition.damaged_transaction_ids == []
    assert_intact(tmp_path, N - 1)


def test_scrubbing_finds_a_flip_made_under_an_open_partition(tmp_path):
    seg, _ = build(tmp_path)
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.scrub(0, 1 << 20) == (0, seg.stat().st_size - 128, [])
        data = bytearray(seg.read_bytes())
        data[128 + 3 * (RECORD_OVERHEAD + SIZE) + 40] ^= 0x10
        seg.write_bytes(bytes(data))
        assert partition.damaged_transaction_ids == []
        found, txn = [], 0
        while True:
            txn, _, damaged = partition.scrub(txn, RECORD_OVERHEAD + SIZE)  # one record a step
            found += damaged
            if txn == 0:
                break
        assert found == [3] and partition.damaged_transaction_ids == [3] and partition.damage_found == 1


def test_garbage_after_the_last_record_is_cut(tmp_path):
    seg, _ = build(tmp_path)
    with seg.open("ab") as f:
        f.write(b"\x00" * 100)
    assert_intact(tmp_path, N - 1)


@pytest.mark.parametrize("damage", ["truncate_after_checkpoint", "garbage_after_checkpoint", "bad_checkpoint"])
def test_index_rebuilt_from_the_last_checkpoint(tmp_path, damage):
    n = 2500
    _, idx = build(tmp_path, n=n, size=4, batch=250)
    good_index = idx.read_bytes()
    entry = lambda txn: 128 + 8 * txn  # noqa: E731
    raw = bytearray(good_index)
    if damage == "truncate_after_checkpoint":
        raw = raw[: entry(2100) + 3]
    elif damage == "garbage_after_checkpoint":
        raw[entry(2001) :] = b"\xab" * (len(raw) - entry(2001))
    else:  # the checkpoint entry itself points nowhere: fall back to the previous checkpoint
        raw[entry(2000) : entry(2001)] = struct.pack(">q", 17)
        raw[entry(1500) :] = b"\xff" * (len(raw) - entry(1500))
    idx.write_bytes(bytes(raw))
    with open_manager(tmp_path) as manager:
        partition = manager.partition(0)
        assert partition.max_transaction_id == n - 1
        assert partition.records(0, n + 10) == make_records(0, n, 4)
        assert [h.transaction_id for h in partition.record_headers(1990, 30)] == list(range(1990, 2020))
    assert idx.read_bytes() == good_index
