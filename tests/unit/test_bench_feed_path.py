"""bench.feed_path's worker feeds its messages through the client's real feed path (a small run)."""

import asyncio

import pytest

from bench.feed_path import build_messages, feed_once


@pytest.mark.parametrize("on_loop", [False, True])
@pytest.mark.parametrize("keep_transactions", [False, True])
def test_every_prebuilt_transaction_is_applied_once_in_order(on_loop: bool, keep_transactions: bool) -> None:
    applied, wall, cpu = asyncio.run(feed_once(build_messages(3, 40), on_loop, keep_transactions))
    assert applied == 120 and wall > 0 and cpu > 0
