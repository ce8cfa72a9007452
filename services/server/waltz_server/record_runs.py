"""Runs of consecutive records as the storage nodes' data files hold them (common.proto RecordRun), for raw
reads: a store's parts merged, a run split into a reader's messages, a run built from Record messages for a
node that predates raw reads. No record is decoded: only the ends are rebased (one C-level pass per run).

Ends travel as little-endian uint32; here they are an array of the host's uint32, swapped on a big-endian host.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, sub

from waltz.v1 import common_pb2
from waltz_common.record_layout import RECORD_OVERHEAD
from waltz_server.store.wire import encode_pending

ENDS_TYPECODE = next(code for code in "IL" if array(code).itemsize == 4)
"""The array type code of a uint32 on this host."""
_BIG_ENDIAN_HOST = sys.byteorder == "big"


@dataclass(frozen=True, slots=True)
class Run:
    """Records first, first + 1, ... back to back in records; record i ends at ends[i] (the host's uint32)."""

    first: int
    records: bytes
    ends: array[int]

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def last(self) -> int:
        """The last record's id (first - 1 when empty)."""
        return self.first + len(self.ends) - 1


def empty_run(first: int) -> Run:
    return Run(first, b"", array(ENDS_TYPECODE))


def ends_from_wire(ends: bytes) -> array[int]:
    """RecordRun.ends as the host's uint32; ValueError unless it is whole uint32s."""
    values = array(ENDS_TYPECODE)
    values.frombytes(ends)
    if _BIG_ENDIAN_HOST:
        values.byteswap()
    return values


def ends_to_wire(ends: array[int]) -> bytes:
    if _BIG_ENDIAN_HOST:
        ends = array(ENDS_TYPECODE, ends)
        ends.byteswap()
    return ends.tobytes()


def run_from_proto(message: common_pb2.RecordRun) -> Run:
    """A storage node's RecordRun; ValueError when its count, ends and bytes disagree (the records themselves are
    the reader's to check)."""
    records = message.records  # each access copies the bytes: read it once
    ends = ends_from_wire(message.ends)
    if len(ends) != message.count or (ends[-1] if ends else 0) != len(records):
        raise ValueError(
            f"a run of {message.count} records from {message.first_transaction_id} with {len(message.ends)} bytes "
            f"of ends and {len(records)} bytes of records"
        )
    return Run(message.first_transaction_id, records, ends)


def run_to_proto(run: Run, target: common_pb2.RecordRun) -> None:
    """Fill target (a message's run field, in place) with run."""
    target.first_transaction_id = run.first
    target.count = len(run)
    target.records = run.records
    target.ends = ends_to_wire(run.ends)


def run_from_records(first: int, records: Sequence[common_pb2.Record]) -> Run:
    """The run of records from a node that answers a raw read with Record messages (it predates raw reads), encoded
    as the server encodes its appends; ValueError unless they are transactions first, first + 1, ..."""
    ids = [r.transaction_id for r in records]
    if ids != list(range(first, first + len(ids))):
        raise ValueError(f"records {ids[:1]}..{ids[-1:]} answered for {len(ids)} from {first}")
    sizes = [len(r.data) + RECORD_OVERHEAD for r in records]
    return Run(first, encode_pending(first, records), array(ENDS_TYPECODE, accumulate(sizes)))


def merge_runs(runs: Sequence[Run]) -> Run:
    """Consecutive runs as one: their bytes joined, each one's ends moved past the bytes before it."""
    if len(runs) == 1:
        return runs[0]
    ends = array(ENDS_TYPECODE)
    at = 0
    for i, run in enumerate(runs):
        if i and run.first != runs[i - 1].last + 1:
            raise ValueError(f"a run from {run.first} does not follow one that ends at {runs[i - 1].last}")
        ends.extend(map(add, run.ends, repeat(at)) if at else run.ends)
        at += len(run.records)
    return Run(runs[0].first, b"".join([run.records for run in runs]), ends)


def slice_run(run: Run, start: int, stop: int) -> Run:
    """Records start..stop - 1 of run (positions in it) as a run of their own."""
    stop = min(stop, len(run))
    if start <= 0 and stop == len(run):
        return run
    if start >= stop:
        return empty_run(run.first + start)
    base = run.ends[start - 1] if start else 0
    ends = run.ends[start:stop]
    if base:
        ends = array(ENDS_TYPECODE, map(sub, ends, repeat(base)))
    return Run(run.first + start, run.records[base : run.ends[stop - 1]], ends)


def pieces(ends: Sequence[int], size: int, max_bytes: int | None = None) -> Iterator[tuple[int, int]]:
    """(start, stop) positions that cut records ending at ends (increasing) into consecutive pieces of at most size
    records and max_bytes bytes, each of at least one record."""
    start = 0
    while start < len(ends):
        stop = start + size
        if max_bytes is not None:
            fit = bisect_right(ends, (ends[start - 1] if start else 0) + max_bytes, start)  # the records that fit
            stop = min(stop, max(fit, start + 1))
        yield start, stop
        start = stop


def split_run(run: Run, size: int, max_bytes: int | None = None) -> Iterator[Run]:
    """run in consecutive runs of at most size records and max_bytes bytes, each of at least one record."""
    for start, stop in pieces(run.ends, size, max_bytes):
        yield slice_run(run, start, stop)
