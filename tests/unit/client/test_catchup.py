"""The pure parts of batched apply and of the catch-up: what a batch still has to apply, where its data comes from,
and what a mount that takes long says."""

from __future__ import annotations

import pytest

from waltz_client import Transaction, WaltzError
from waltz_client.apply_batch import still_to_apply
from waltz_client.batch_data import READ_CHUNK, BatchData
from waltz_client.catchup import CatchUp, duration, mount_wait_reason
from waltz_client.partition_state import MountState


def _batch(first: int, count: int) -> list[Transaction]:
    return [Transaction(3, i, None, 0, lambda: b"") for i in range(first, first + count)]  # type: ignore[arg-type]


def test_still_to_apply_skips_up_to_the_stored_mark_and_refuses_a_gap_or_holes() -> None:
    batch = _batch(10, 5)
    assert still_to_apply(batch, 9) == batch
    assert [t.transaction_id for t in still_to_apply(batch, 12)] == [13, 14]
    assert still_to_apply(batch, 14) == [] and still_to_apply(batch, 40) == []
    assert still_to_apply([], 5) == []
    with pytest.raises(WaltzError, match="partition 3: the database's high-water mark is 8, cannot apply "
                                         "transaction 10"):
        still_to_apply(batch, 8)
    with pytest.raises(WaltzError, match="consecutive transactions, not 2 from 10 to 12"):
        still_to_apply([batch[0], batch[2]], 9)


def test_batch_data_reads_the_rest_of_the_batch_at_the_first_fetch() -> None:
    ranges: list[tuple[int, int]] = []
    singles: list[int] = []

    def fetch_range(pid: int, first: int, last: int) -> dict[int, bytes]:
        ranges.append((first, last))
        return {i: b"r%d" % i for i in range(first, last + 1)}

    def fetch_one(pid: int, txn_id: int) -> bytes:
        singles.append(txn_id)
        return b"s%d" % txn_id

    source = BatchData(fetch_one, fetch_range, 2 * READ_CHUNK + 5)
    assert [source(0, i) for i in range(3)] == [b"r0", b"r1", b"r2"]
    assert ranges == [(0, READ_CHUNK - 1)] and singles == []
    assert source(0, READ_CHUNK) == b"r%d" % READ_CHUNK and ranges[-1] == (READ_CHUNK, 2 * READ_CHUNK - 1)
    assert source(0, 2 * READ_CHUNK + 5) == b"s%d" % (2 * READ_CHUNK + 5)  # the last one: no range to read


def test_batch_data_falls_back_to_one_at_a_time_when_a_range_fails() -> None:
    calls: list[int] = []

    def broken(pid: int, first: int, last: int) -> dict[int, bytes]:
        calls.append(first)
        raise NotImplementedError("no ReadTransactions")

    source = BatchData(lambda pid, txn: b"s%d" % txn, broken, 10)
    assert [source(0, i) for i in range(4)] == [b"s0", b"s1", b"s2", b"s3"]
    assert calls == [0]  # tried once per batch


def test_catch_up_progress_rate_and_time_left() -> None:
    catchup = CatchUp(started_at=100.0, start_high_water_mark=999, endpoint="server-1:5000")
    assert catchup.describe(100.0, 999) == "applied 0 (the partition's high-water mark not heard yet) at 0/s"
    assert not catchup.catching_up(999) and catchup.remaining(999) == 0
    catchup.target = 56_999
    assert catchup.catching_up(999)
    assert catchup.describe(110.0, 4_399) == "applied 3,400 of 56,000 at 340/s, about 2 min 35 s left"
    assert catchup.remaining(4_399) == 52_600
    assert catchup.describe(110.0, 60_000).startswith("applied 59,001 of 59,001 at ")  # the log grew meanwhile


def test_durations_read_naturally() -> None:
    assert [duration(s) for s in (0.46, 9.94, 45, 129, 11_100)] == ["0.5 s", "9.9 s", "45 s", "2 min 9 s",
                                                                   "3 h 5 min"]


def test_the_mount_timeout_says_what_it_waited_for() -> None:
    catchup = CatchUp(started_at=0.0, start_high_water_mark=-1, endpoint="s:1", target=55_999)
    mounting = MountState.MOUNTING
    assert mount_wait_reason(mounting, None, None, -1, 10.0, None).startswith("no server owns the partition")
    assert mount_wait_reason(mounting, "s:1", catchup, 11_999, 10.0, None) == (
        "still catching up from s:1: applied 12,000 of 56,000 at 1,200/s, about 37 s left (a mount completes only "
        "once the feed up to the partition's high-water mark is applied)")
    assert mount_wait_reason(mounting, "s:1", catchup, -1, 10.0, None) == (
        "still catching up from s:1: applied 0 of 56,000 at 0/s (a mount completes only once the feed up to the "
        "partition's high-water mark is applied)")
    quiet = CatchUp(started_at=0.0, start_high_water_mark=5, endpoint="s:1")
    assert mount_wait_reason(mounting, "s:1", quiet, 5, 10.0, None) == (
        "no answer from server s:1 to the mount request for 10 s")
    assert mount_wait_reason(mounting, "s:1", quiet, 5, 3.0, "cannot reach server s:0: refused") == (
        "no answer from server s:1 to the mount request for 3.0 s (before it: cannot reach server s:0: refused)")
    assert mount_wait_reason(MountState.UNMOUNTED, "s:1", None, 5, 3.0, "cannot reach server s:1: refused") == (
        "cannot reach server s:1: refused")
    assert mount_wait_reason(MountState.UNMOUNTED, "s:1", None, 5, 3.0, None) == "mount state: unmounted, server s:1"
