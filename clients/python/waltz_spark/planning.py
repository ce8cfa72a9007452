"""Pure offset arithmetic: start/end positions, read ranges per task and admission control by rows and bytes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from waltz_spark.options import OptionError, Position

NOTHING = -1
"""The offset of a partition nothing of which has been read: the id before transaction 0."""
ROW_OVERHEAD_BYTES = 32
"""A row's bytes besides its data: the six fixed-width columns (28 B) and the data's Arrow offset (4 B)."""


@dataclass(frozen=True, slots=True)
class ReadRange:
    """Transactions first..last (inclusive) of one partition."""

    partition: int
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def offset_key(partition: int) -> str:
    return f"p{partition}"


def to_offset(positions: Mapping[int, int]) -> dict[str, int]:
    """{pid: last id read} as the JSON-friendly streaming offset {"p<pid>": id}."""
    return {offset_key(pid): int(positions[pid]) for pid in sorted(positions)}


def from_offset(offset: Mapping[str, int], partitions: Iterable[int]) -> dict[int, int]:
    """The last id read of each partition; a partition the offset does not name starts at the beginning."""
    return {pid: int(offset.get(offset_key(pid), NOTHING)) for pid in partitions}


def start_positions(
    starting: Position | dict[int, int], partitions: list[int], hwms: Mapping[int, int]
) -> dict[int, int]:
    """Last id already read (exclusive start) per partition for startingOffsets; JSON ids are the first to read."""
    if starting == "earliest":
        return {pid: NOTHING for pid in partitions}
    if starting == "latest":
        return {pid: hwms[pid] for pid in partitions}
    _check_named(starting, partitions, "startingOffsets")
    positions = {}
    for pid in partitions:
        first = starting.get(pid, 0)
        if first > hwms[pid] + 1:
            raise OptionError(
                f"startingOffsets: partition {pid} starts at transaction {first}, "
                f"beyond its high-water mark {hwms[pid]} (+1)"
            )
        positions[pid] = first - 1
    return positions


def end_positions(ending: Position | dict[int, int], partitions: list[int], hwms: Mapping[int, int]) -> dict[int, int]:
    """Last id to read (inclusive) per partition for a batch read's endingOffsets."""
    if ending == "latest":
        return {pid: hwms[pid] for pid in partitions}
    if ending == "earliest":
        raise OptionError("endingOffsets cannot be 'earliest'; use 'latest' or JSON {\"<pid>\": <last id>}")
    _check_named(ending, partitions, "endingOffsets")
    positions = {}
    for pid in partitions:
        last = ending.get(pid, hwms[pid])
        if last > hwms[pid]:
            raise OptionError(
                f"endingOffsets: partition {pid} ends at transaction {last}, "
                f"above its high-water mark {hwms[pid]} (only committed transactions can be read)"
            )
        positions[pid] = last
    return positions


def _check_named(named: Mapping[int, int], partitions: list[int], option: str) -> None:
    unknown = sorted(set(named) - set(partitions))
    if unknown:
        raise OptionError(f"{option} names partition(s) {unknown} that are not read (partitions: {partitions})")


def plan_ranges(start: Mapping[int, int], end: Mapping[int, int], records_per_task: int) -> list[ReadRange]:
    """The ranges (start, end] of every partition, each cut into pieces of at most records_per_task."""
    ranges = []
    for pid in sorted(end):
        first, last = start.get(pid, NOTHING) + 1, end[pid]
        while first <= last:
            piece_last = min(last, first + records_per_task - 1)
            ranges.append(ReadRange(pid, first, piece_last))
            first = piece_last + 1
    return ranges


def split_range(first: int, last: int, pieces: int, min_records: int) -> list[tuple[int, int]]:
    """first..last cut into at most `pieces` consecutive ranges of nearly equal size, none under min_records."""
    count = last - first + 1
    n = max(1, min(pieces, count // max(1, min_records)))
    bounds = [first + count * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


def check_not_behind(start: Mapping[int, int], hwms: Mapping[int, int]) -> None:
    """A high-water mark below what was already read means another cluster or a lost log: never silently skip."""
    for pid, hwm in sorted(hwms.items()):
        if hwm < start.get(pid, NOTHING):
            raise RuntimeError(
                f"partition {pid}: high-water mark {hwm} is below the offset already read ({start[pid]}); "
                "is this the same cluster (was it recreated)? Use a new checkpoint location to start over"
            )


def admit(
    start: Mapping[int, int], available: Mapping[int, int], per_partition: int | None, total: int | None
) -> dict[int, int]:
    """End positions at most per_partition past start on each partition and total in all, shared fairly."""
    pending = {pid: max(0, available[pid] - start.get(pid, NOTHING)) for pid in available}
    if per_partition is not None:
        pending = {pid: min(n, per_partition) for pid, n in pending.items()}
    if total is not None and sum(pending.values()) > total:
        pending = _share(pending, total)
    return {pid: start.get(pid, NOTHING) + n for pid, n in pending.items()}


def _share(wanted: Mapping[int, int], total: int) -> dict[int, int]:
    """Water-filling: every partition gets the same share, and what small ones leave goes to the others."""
    granted = dict.fromkeys(wanted, 0)
    left = total
    open_ = sorted((pid for pid in wanted if wanted[pid] > 0), key=lambda p: (wanted[p], p))
    while open_ and left > 0:
        share = max(1, left // len(open_))
        for pid in list(open_):
            give = min(share, wanted[pid] - granted[pid], left)
            granted[pid] += give
            left -= give
            if granted[pid] == wanted[pid]:
                open_.remove(pid)
            if left == 0:
                break
    return granted


def admit_bytes(
    start: Mapping[int, int], ends: Mapping[int, int], bytes_per_record: Mapping[int, float], max_bytes: int
) -> dict[int, int]:
    """Narrow ends so the rows (start, end] weigh at most max_bytes by the estimates, each partition getting the
    same share of bytes (water-filling); one record at least when any is pending, so a big record still passes."""
    pending = {pid: max(0, ends[pid] - start.get(pid, NOTHING)) for pid in ends}
    weight = {pid: max(1.0, float(bytes_per_record.get(pid, 0.0)) + ROW_OVERHEAD_BYTES) for pid in ends}
    wanted = {pid: math.ceil(n * weight[pid]) for pid, n in pending.items()}
    granted = _share(wanted, max_bytes) if sum(wanted.values()) > max_bytes else wanted
    rows = {pid: min(pending[pid], int(granted[pid] // weight[pid])) for pid in ends}
    if not any(rows.values()) and any(pending.values()):
        first = min((pid for pid in ends if pending[pid]), key=lambda p: (weight[p], p))
        rows[first] = 1
    return {pid: start.get(pid, NOTHING) + rows[pid] for pid in ends}


class RecordSizes:
    """Bytes per record of each partition, learned from samples of its newest records; a sample older than
    max_age_s is taken again, so that admission by bytes follows a feed whose records grow or shrink."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._known: dict[int, tuple[float, float]] = {}

    def stale(self, partitions: Iterable[int], now: float) -> list[int]:
        """The partitions to sample now: never sampled, or longer ago than max_age_s."""
        return [pid for pid in partitions if pid not in self._known or now - self._known[pid][1] > self.max_age_s]

    def learn(self, partition: int, data_bytes: int, records: int, now: float) -> None:
        if records > 0:
            self._known[partition] = (data_bytes / records, now)

    def per_record(self) -> dict[int, float]:
        return {pid: size for pid, (size, _) in self._known.items()}
