"""read_range: dense batches in order with store reads planned ahead, re-planned after short answers."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from types import SimpleNamespace

import pytest

from waltz.v1 import common_pb2
from waltz_server.record_runs import Run, run_from_records
from waltz_server.store.api import StoreUnavailable
from waltz_server.transaction_data import RangeError, read_range, read_runs


class Store:
    """Records 0..high_water_mark; answers at most `cap` records; a read from `fail_at` fails."""

    def __init__(self, high_water_mark: int, cap: int = 1_000_000, fail_at: int | None = None) -> None:
        self.high_water_mark = high_water_mark
        self.cap = cap
        self.fail_at = fail_at
        self.asked: list[tuple[int, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.cancelled = 0
        self.skew = 0  # runs answered start this far from the id asked

    async def get_records(self, first: int, count: int) -> list[common_pb2.Record]:
        self.asked.append((first, count))
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if first == self.fail_at:
            raise StoreUnavailable(f"no read from {first}")
        last = min(first + min(count, self.cap), self.high_water_mark + 1)
        return [common_pb2.Record(transaction_id=t) for t in range(first, last)]

    async def get_run(self, first: int, count: int) -> Run:
        got = run_from_records(first, await self.get_records(first, count))
        return dataclasses.replace(got, first=got.first + self.skew)


async def until(predicate, turns: int = 100) -> None:
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def partition(store: Store) -> SimpleNamespace:
    return SimpleNamespace(partition_id=3, high_water_mark=store.high_water_mark, store=store)


async def ids(store: Store, first: int, last: int, size: int, store_batch: int = 1) -> list[list[int]]:
    return [
        [r.transaction_id for r in batch]
        async for batch in read_range(partition(store), first, last, size, 2, store_batch)  # type: ignore[arg-type]
    ]


def test_batches_in_order_with_reads_planned_ahead() -> None:
    async def scenario() -> None:
        store = Store(99)
        assert await ids(store, 5, 16, 4) == [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
        assert store.asked == [(5, 4), (9, 4), (13, 4)]
        store.asked.clear()
        store.gate.clear()
        reader = read_range(partition(store), 0, 99, 10, 2, 1)  # type: ignore[arg-type]
        first = asyncio.ensure_future(anext(reader))
        await until(lambda: len(store.asked) == 3)
        for _ in range(20):  # and no more, however long it waits
            await asyncio.sleep(0)
        assert store.asked == [(0, 10), (10, 10), (20, 10)]  # this batch and two ahead, before any answer
        store.gate.set()
        assert [r.transaction_id for r in await first] == list(range(10))
        await reader.aclose()

    asyncio.run(scenario())


def test_store_reads_are_larger_than_messages_and_split_for_them() -> None:
    async def scenario() -> None:
        store = Store(99)
        assert await ids(store, 5, 16, 4, store_batch=10) == [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14], [15, 16]]
        assert store.asked == [(5, 10), (15, 2)]
        store.asked.clear()
        assert await ids(store, 0, 7, 5, store_batch=2) == [[0, 1, 2, 3, 4], [5, 6, 7]]  # never below the size
        assert store.asked == [(0, 5), (5, 3)]

    asyncio.run(scenario())


def test_short_answers_replan_the_reads_after_them() -> None:
    async def scenario() -> None:
        store = Store(99, cap=3)
        got = await ids(store, 0, 11, 5)
        assert [t for batch in got for t in batch] == list(range(12))
        assert got[0] == [0, 1, 2] and all(len(batch) <= 3 for batch in got)

    asyncio.run(scenario())


def test_a_failed_read_ahead_surfaces_when_its_batch_is_due() -> None:
    async def scenario() -> None:
        store = Store(99, fail_at=8)
        seen: list[int] = []
        with pytest.raises(StoreUnavailable, match="no read from 8"):
            async for batch in read_range(partition(store), 0, 20, 4, 2, 1):  # type: ignore[arg-type]
                seen.extend(r.transaction_id for r in batch)
        assert seen == list(range(8))

    asyncio.run(scenario())


def test_a_reader_that_leaves_cancels_what_was_planned() -> None:
    async def scenario() -> None:
        store = Store(99)
        store.gate.clear()
        reader = read_range(partition(store), 0, 99, 10, 2, 1)  # type: ignore[arg-type]
        pending = asyncio.ensure_future(anext(reader))
        await until(lambda: len(store.asked) == 3)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await reader.aclose()
        await until(lambda: store.cancelled == 3)  # the batch being waited for and the two planned after it

    asyncio.run(scenario())


def test_ranges_are_checked_before_any_read() -> None:
    async def scenario() -> None:
        store = Store(9)
        with pytest.raises(RangeError, match="high-water mark 9"):
            await ids(store, 0, 10, 5)
        with pytest.raises(RangeError, match="bad range"):
            await ids(store, 5, 4, 5)
        assert store.asked == []

    asyncio.run(scenario())


async def run_ids(store: Store, first: int, last: int, size: int, store_batch: int = 1) -> list[list[int]]:
    return [
        list(range(run.first, run.last + 1))
        async for run in read_runs(partition(store), first, last, size, read_ahead=2, store_batch=store_batch)  # type: ignore[arg-type]
    ]


def test_runs_are_read_ahead_and_split_as_records_are_and_hold_the_same_records() -> None:
    async def scenario() -> None:
        for cap, store_batch, first, last, size in ((1000, 10, 5, 16, 4), (3, 1, 0, 11, 5), (1000, 2, 0, 7, 5)):
            store = Store(99, cap=cap)
            expected = await ids(store, first, last, size, store_batch)
            asked = list(store.asked)
            store.asked.clear()
            assert await run_ids(store, first, last, size, store_batch) == expected
            assert store.asked == asked
        store = Store(99)
        async for run in read_runs(partition(store), 3, 9, 4, store_batch=10):  # type: ignore[arg-type]
            assert run.ends[-1] == len(run.records) == 40 * len(run)  # each piece's ends start from its own bytes

    asyncio.run(scenario())


def test_a_run_that_does_not_start_where_asked_is_refused() -> None:
    async def scenario() -> None:
        store = Store(99)
        store.skew = 1
        with pytest.raises(StoreUnavailable, match=re.escape("answered transactions 6..15 (10) for 10 from 5")):
            await run_ids(store, 5, 20, 4, store_batch=10)

    asyncio.run(scenario())


def test_messages_are_bounded_by_bytes_as_well_as_records() -> None:
    async def scenario() -> None:
        store = Store(99)  # records without data: 40 bytes each in the data file
        got = [
            [r.transaction_id for r in batch]
            async for batch in read_range(partition(store), 0, 20, 8, 2, 100, max_bytes=120)  # type: ignore[arg-type]
        ]
        assert got == [list(range(i, min(i + 3, 21))) for i in range(0, 21, 3)]  # 3 records fit in 120 bytes
        runs = [
            (run.first, len(run))
            async for run in read_runs(partition(store), 0, 20, 8, 130, store_batch=100)  # type: ignore[arg-type]
        ]
        assert runs == [(i, min(3, 21 - i)) for i in range(0, 21, 3)]
        single = [len(b) async for b in read_range(partition(store), 0, 4, 8, 2, 100, max_bytes=1)]  # type: ignore[arg-type]
        assert single == [1] * 5  # a record larger than the bound goes alone

    asyncio.run(scenario())
