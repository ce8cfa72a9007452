"""CacheBudget: the feed and data caches of many partitions stay within one server-wide byte budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_common.types import Record, ReqId
from waltz_server.cache_budget import DATA_ENTRY_BYTES, FEED_ENTRY_BYTES, CacheBudget
from waltz_server.caches import DataCache, FeedCache


def record(transaction_id: int, size: int) -> Record:
    return Record(transaction_id, ReqId(1, 1, 0, transaction_id), 0, b"x" * size, 0)


def fill_data(cache: DataCache, first: int, count: int, size: int) -> None:
    for txn in range(first, first + count):
        cache.put(txn, record(txn, size), size)


def fill_feed(cache: FeedCache[int], count: int, batch: int = 10) -> None:
    for _ in range(count // batch):
        first = cache.high_water_mark + 1
        cache.append(first, list(range(first, first + batch)))


def test_sixteen_partitions_stay_within_the_budget():
    budget = CacheBudget(1_000_000)
    data = [DataCache(64 * 2**20, budget) for _ in range(16)]
    feeds: list[FeedCache[int]] = [FeedCache(100_000, budget=budget) for _ in range(16)]
    for cache, feed in zip(data, feeds, strict=True):
        fill_data(cache, 0, 2000, 500)  # 1.5 MB each, alone already over the budget
        fill_feed(feed, 2000)
        assert budget.used <= budget.max_bytes
    assert budget.used == sum(c.charged for c in data) + sum(f.charged for f in feeds)
    use = budget.use_by_kind()
    assert use["feed"] + use["data"] == budget.used
    assert all(f.charged > 0 for f in feeds[-3:]) and all(c.charged > 0 for c in data[-3:])


def test_the_largest_cache_gives_back_first():
    budget = CacheBudget(100_000, slack=0)
    big, small = DataCache(10**9, budget), DataCache(10**9, budget)
    fill_data(small, 0, 10, 1000)
    small_before = small.charged
    fill_data(big, 0, 200, 1000)  # goes over: big is the largest, so big loses its oldest entries
    assert small.charged == small_before and budget.used <= 100_000
    assert big.get(0) is None and big.get(199) is not None and small.get(0) is not None


def test_a_feed_cache_evicts_its_oldest_entries_and_still_serves_its_tail():
    budget = CacheBudget(50 * FEED_ENTRY_BYTES, slack=0)
    feed: FeedCache[int] = FeedCache(1000, budget=budget)
    fill_feed(feed, 200)
    assert feed.charged <= 50 * FEED_ENTRY_BYTES and feed.high_water_mark == 199
    assert feed.first_id == 200 - feed.charged // FEED_ENTRY_BYTES
    assert feed.get(feed.first_id, 1000) == list(range(feed.first_id, 200))
    assert feed.get(feed.first_id - 1, 1) is None


def test_closing_a_partitions_caches_frees_their_share():
    budget = CacheBudget(10**9)
    data, feed = DataCache(10**9, budget), FeedCache[int](100, budget=budget)
    fill_data(data, 0, 10, 100)
    fill_feed(feed, 50)
    assert budget.used == 10 * (100 + DATA_ENTRY_BYTES) + 50 * FEED_ENTRY_BYTES and len(budget) == 2
    data.close()
    feed.close()
    assert budget.used == 0 and len(budget) == 0
    fill_data(data, 10, 5, 100)  # a read finishing after the close: not charged to the server's budget
    assert budget.used == 0


def test_a_gap_restarts_the_feed_cache_and_releases_it():
    budget = CacheBudget(10**9)
    feed: FeedCache[int] = FeedCache(100, budget=budget)
    fill_feed(feed, 30)
    feed.append(100, [100])
    assert budget.used == FEED_ENTRY_BYTES == feed.charged


def test_a_budget_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 byte"):
        CacheBudget(0)


@given(st.integers(2_000, 200_000), st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.booleans()),
                                             max_size=60))
def test_the_budget_always_holds_and_adds_up(max_bytes, steps):
    budget = CacheBudget(max_bytes)
    data = [DataCache(10**9, budget) for _ in range(3)]
    feeds: list[FeedCache[int]] = [FeedCache(10**6, budget=budget) for _ in range(3)]
    next_txn = 0
    for which, count, is_feed in steps:
        if is_feed:
            fill_feed(feeds[which % 3], count * 10)
        else:
            fill_data(data[which % 3], next_txn, count, 100)
            next_txn += count
        assert budget.used <= max_bytes
        assert budget.used == sum(c.charged for c in data) + sum(f.charged for f in feeds)
        for feed in feeds:
            hwm = feed.high_water_mark
            assert feed.get(feed.first_id, 10**6) == list(range(feed.first_id, hwm + 1))


def test_the_metrics_show_the_budget_and_its_use_by_cache():
    from prometheus_client import generate_latest

    from waltz_server.metrics import ServerMetrics

    metrics = ServerMetrics()
    budget = CacheBudget(10**6)
    metrics.watch_cache_budget(budget)
    fill_data(DataCache(10**9, budget), 0, 3, 100)
    text = generate_latest(metrics.registry).decode()
    assert "waltz_server_cache_budget_bytes 1e+06" in text
    assert f'waltz_server_cache_bytes{{cache="data"}} {3.0 * (100 + DATA_ENTRY_BYTES)}' in text
    assert 'waltz_server_cache_bytes{cache="feed"} 0.0' in text
