"""FeedCache (recent feed entries by id) and DataCache (LRU by data bytes)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_common.types import Record, ReqId
from waltz_server.caches import DataCache, FeedCache


def test_feed_cache_holds_the_most_recent_entries():
    cache: FeedCache[int] = FeedCache(5, high_water_mark=9)
    assert cache.first_id == 10 and cache.get(10, 3) == []
    cache.append(10, [10, 11, 12])
    assert cache.get(10, 10) == [10, 11, 12]
    cache.append(13, [13, 14, 15, 16])
    assert cache.first_id == 12 and cache.high_water_mark == 16
    assert cache.get(11, 1) is None
    assert cache.get(12, 10) == [12, 13, 14, 15, 16]
    assert cache.get(15, 1) == [15]
    assert cache.get(18, 1) is None


def test_feed_cache_restarts_after_a_gap_and_keeps_the_tail_of_a_huge_batch():
    cache: FeedCache[int] = FeedCache(4)
    cache.append(0, [0, 1])
    cache.append(5, [5])
    assert cache.first_id == 5 and cache.get(5, 9) == [5]
    cache.append(6, list(range(6, 16)))
    assert cache.first_id == 12 and cache.get(12, 9) == [12, 13, 14, 15]


@given(st.integers(1, 20), st.lists(st.integers(1, 30), max_size=15), st.integers(0, 400), st.integers(1, 50))
def test_feed_cache_matches_a_model(capacity, batch_sizes, start, count):
    cache: FeedCache[int] = FeedCache(capacity)
    next_id = 0
    segments = {}
    for size in batch_sizes:
        segments[next_id] = list(range(next_id, next_id + size))
        cache.append(next_id, segments[next_id], whole=("batch", next_id))
        next_id += size
    first = max(0, next_id - capacity)
    assert cache.first_id == first
    got = cache.get(start, count)
    spans = cache.spans(start, count)
    if first <= start <= next_id:
        assert got == list(range(start, min(next_id, start + count)))
        assert spans is not None  # the same entries, taken segment by segment
        assert [e for segment, offset, n, _ in spans for e in segments[segment][offset : offset + n]] == got
        assert all(n > 0 and whole == ("batch", segment) for segment, _, n, whole in spans)
    else:
        assert got is None and spans is None


def test_feed_cache_stays_exact_over_many_batches():
    cache: FeedCache[int] = FeedCache(10)
    next_id = 0
    for i in range(500):  # enough batches that the dropped ones are compacted away several times
        size = 1 + i % 3
        cache.append(next_id, list(range(next_id, next_id + size)))
        next_id += size
        assert cache.first_id == max(0, next_id - 10)
        assert cache.get(cache.first_id, 100) == list(range(cache.first_id, next_id))
        assert cache.get(cache.first_id - 1, 1) is None or cache.first_id == 0
    assert len(cache._segments) < 80  # dropped batches do not pile up


def record(txn: int, size: int) -> Record:
    return Record(txn, ReqId(1, 1, 0, txn), 0, b"x" * size, 0)


def put(cache: DataCache, r: Record) -> None:
    cache.put(r.transaction_id, r, len(r.data))


def test_data_cache_evicts_least_recently_used_by_bytes():
    cache = DataCache(100)
    for txn in range(4):
        put(cache, record(txn, 25))
    assert cache.size_bytes == 100
    assert cache.get(0) is not None  # 0 is now the most recent
    put(cache, record(4, 25))
    assert cache.get(1) is None and cache.get(0) is not None and cache.size_bytes == 100
    put(cache, record(5, 26))  # larger than a quarter of the budget: not cached
    assert cache.get(5) is None
    cache.clear()
    assert len(cache) == 0 and cache.size_bytes == 0


def test_feed_cache_needs_capacity():
    with pytest.raises(ValueError):
        FeedCache(0)


@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(1, 40), max_size=12)), max_size=12),
       st.integers(40, 200))
def test_data_cache_put_many_keeps_what_put_one_by_one_keeps(batches: list[tuple[int, list[int]]], budget: int) -> None:
    """A committed batch put at once (put_many) leaves the cache, its bytes and its budget charge as putting each
    transaction alone does; reads in between reorder the recency alike."""
    one, many = DataCache(budget), DataCache(budget)
    next_id = 0
    for read_back, sizes in batches:
        records = [record(next_id + i, size) for i, size in enumerate(sizes)]
        for r in records:
            put(one, r)
        many.put_many(next_id, [(r, len(r.data)) for r in records])
        next_id += len(sizes)
        for txn in range(max(0, next_id - read_back), next_id):
            assert (one.get(txn) is None) == (many.get(txn) is None)
    held = [t for t in range(next_id) if one.get(t) is not None]
    assert held == [t for t in range(next_id) if many.get(t) is not None]
    assert (many.size_bytes, many.charged, len(many)) == (one.size_bytes, one.charged, len(one))
