"""Crash recovery: cut or damage segment files, reopen, and find exactly the intact prefix."""

import struct

import pytest

from tests.component.storage.helpers import make_record, make_records, open_manager, restore, snapshot
from waltz_storage.codec import RECORD_OVERHEAD

N = 5
SIZE = 24  # a small last record keeps the every-byte loop to a few dozen reopenings


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


def test_flipped_byte_recovers_to_the_record_before(tmp_path):
    seg, _ = build(tmp_path)
    original = snapshot(tmp_path)
    record_size = RECORD_OVERHEAD + SIZE
    damaged = 2
    start = 128 + damaged * record_size
    for offset in range(start, start + record_size):
        restore(original)
        data = bytearray(original[seg])
        data[offset] ^= 0x10
        seg.write_bytes(bytes(data))
        assert_intact(tmp_path, damaged - 1)


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
