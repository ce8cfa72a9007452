"""record_runs: runs merged, split and sliced with their ends rebased, read off the wire and built from Records."""

from __future__ import annotations

import struct
import sys
from array import array
from itertools import accumulate, pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz.v1 import common_pb2
from waltz_common.types import crc32
from waltz_server import record_runs
from waltz_server.record_runs import (
    ENDS_TYPECODE,
    Run,
    ends_from_wire,
    ends_to_wire,
    merge_runs,
    run_from_proto,
    run_from_records,
    run_to_proto,
    slice_run,
    split_run,
)


def record(txn: int, data: bytes) -> common_pb2.Record:
    req_id = common_pb2.ReqId(client_id=1, generation=2, partition_id=0, seq_num=txn)
    return common_pb2.Record(
        transaction_id=txn, req_id=req_id, header=txn % 3, data_length=len(data), data=data, checksum=crc32(data)
    )


def records(first: int, sizes: list[int]) -> list[common_pb2.Record]:
    return [record(first + i, bytes([i % 251]) * size) for i, size in enumerate(sizes)]


def pieces(run: Run) -> list[bytes]:
    """Each record's bytes, cut where the ends say."""
    return [run.records[a:b] for a, b in zip([0, *run.ends], run.ends, strict=False)]


sizes = st.lists(st.integers(0, 60), max_size=30)


@given(sizes, st.integers(1, 7))
def test_a_split_run_is_the_run_in_order_in_pieces_of_size(data_sizes, size):
    whole = run_from_records(10, records(10, data_sizes))
    split = list(split_run(whole, size))
    assert all(0 < len(p) <= size for p in split) and sum(map(len, split)) == len(whole)
    assert [p.first for p in split] == list(range(10, 10 + len(whole), size))
    assert [b for p in split for b in pieces(p)] == pieces(whole)
    assert all(p.ends[-1] == len(p.records) for p in split)
    if split:
        assert merge_runs(split) == whole


@given(sizes, st.integers(1, 7), st.integers(1, 300))
def test_a_run_split_by_bytes_too_keeps_each_piece_within_both_bounds(data_sizes, size, max_bytes):
    whole = run_from_records(10, records(10, data_sizes))
    split = list(split_run(whole, size, max_bytes))
    assert all(0 < len(p) <= size for p in split) and sum(map(len, split)) == len(whole)
    assert all(len(p.records) <= max_bytes or len(p) == 1 for p in split)  # one record larger than the bound goes alone
    assert [b for p in split for b in pieces(p)] == pieces(whole)
    for p, after in pairwise(split):  # each piece as long as the bounds let it be
        assert len(p) == size or len(p.records) + len(pieces(after)[0]) > max_bytes
    if split:
        assert merge_runs(split) == whole


@given(st.lists(sizes, min_size=1, max_size=4))
def test_merged_parts_are_the_run_of_all_their_records(parts_sizes):
    first, parts, every = 5, [], []
    for part_sizes in parts_sizes:
        part = records(first, part_sizes)
        parts.append(run_from_records(first, part))
        every += part
        first += len(part)
    assert merge_runs(parts) == run_from_records(5, every)


def test_runs_that_do_not_follow_each_other_are_not_merged():
    one, two = run_from_records(0, records(0, [3, 4])), run_from_records(3, records(3, [1]))
    with pytest.raises(ValueError, match="does not follow"):
        merge_runs([one, two])


def test_slices_of_a_run():
    whole = run_from_records(0, records(0, [0, 5, 2, 9]))
    assert slice_run(whole, 0, 10) is whole
    middle = slice_run(whole, 1, 3)
    assert (middle.first, pieces(middle)) == (1, pieces(whole)[1:3])
    assert list(middle.ends) == [45, 45 + 42]
    empty = slice_run(whole, 4, 6)
    assert (empty.first, len(empty), empty.records) == (4, 0, b"")


def test_a_run_from_records_is_the_data_files_layout():
    got = run_from_records(7, records(7, [0, 3]))
    prefix = struct.pack(">q4iiii", 7, 1, 2, 0, 7, 7 % 3, 0, 0)
    assert got.records[:40] == prefix + struct.pack(">I", crc32(prefix) & 0xFFFFFFFF)
    assert list(got.ends) == [40, 83]
    with pytest.raises(ValueError, match="answered for 2 from 6"):
        run_from_records(6, records(7, [0, 3]))


def test_the_wire_form_round_trips_and_its_ends_are_little_endian():
    whole = run_from_records(3, records(3, [1, 2, 300]))
    message = common_pb2.RecordRun()
    run_to_proto(whole, message)
    assert (message.first_transaction_id, message.count) == (3, 3)
    assert message.ends == struct.pack("<3I", *accumulate([41, 42, 340]))
    assert run_from_proto(message) == whole
    for count, ends, data in ((2, message.ends, message.records), (3, message.ends, message.records[:-1])):
        bad = common_pb2.RecordRun(first_transaction_id=3, count=count, records=data, ends=ends)
        with pytest.raises(ValueError, match="a run of"):
            run_from_proto(bad)
    with pytest.raises(ValueError):  # not whole uint32s
        run_from_proto(common_pb2.RecordRun(count=1, records=b"x", ends=b"\x01\x00\x00"))


@pytest.mark.skipif(sys.byteorder == "big", reason="pretends to be a big-endian host on a little-endian one")
def test_on_a_big_endian_host_the_ends_are_swapped_both_ways(monkeypatch):
    native = array(ENDS_TYPECODE, [1, 258])
    little = struct.pack("<2I", 1, 258)
    monkeypatch.setattr(record_runs, "_BIG_ENDIAN_HOST", True)
    # On this (little-endian) host, "swapping" shows that each way swaps exactly once and leaves its input alone.
    assert ends_to_wire(native) == struct.pack(">2I", 1, 258) and list(native) == [1, 258]
    assert list(ends_from_wire(little)) == [0x01000000, 0x02010000]
    assert list(ends_from_wire(ends_to_wire(native))) == [1, 258]
