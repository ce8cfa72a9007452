"""FeedCursor: where a feed reads next, and when a mount's READY is due."""

from __future__ import annotations

from waltz_server.feed_cursor import FeedCursor, FeedStep, Source


def test_mount_catch_up_from_the_store_then_the_cache_then_ready():
    cursor = FeedCursor(0, ready_at=2500)
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.STORE, 0, 1500)
    cursor.sent(1500)
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.STORE, 1500, 500)
    cursor.sent(500)
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.CACHE, 2000, 501)  # stops at the mount target
    cursor.sent(501)
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.READY)
    cursor.ready_sent()
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.CACHE, 2501, 500)
    cursor.sent(500)
    assert cursor.step(3000, 2000, 1000, 1500) == FeedStep(Source.WAIT)
    assert cursor.lag(3000) == 0 and cursor.lag(3010) == 10


def test_up_to_date_mount_is_ready_at_once_and_feed_requests_move_the_cursor():
    cursor = FeedCursor(5, ready_at=4)
    assert cursor.step(4, 0, 10, 10).source is Source.READY
    cursor.ready_sent()
    assert cursor.step(4, 0, 10, 10).source is Source.WAIT
    cursor.restart(1)
    assert cursor.step(4, 0, 10, 10) == FeedStep(Source.CACHE, 2, 3)
