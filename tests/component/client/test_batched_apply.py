"""Batched apply and the catch-up on the mock server: apply_transactions gets the feed's batches in order, exactly
once, retried from the first transaction not applied; a mount's catch-up shows in the log, the metrics and the
mount timeout's message."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, client, run
from tests.component.client.test_client_metrics import samples, value
from waltz_client import AsyncWaltzClient, MockServer, Transaction, WaltzTimeoutError
from waltz_client.api import PartialApplyError


class BatchCallbacks(MemoryCallbacks):
    """MemoryCallbacks that apply batches: records each batch's ids; fails as told (whole, or after some)."""

    def __init__(self, events: list[tuple[Any, ...]] | None = None) -> None:
        super().__init__(events)
        self.batches: list[list[int]] = []
        self.fail_batches = 0  # raise RuntimeError, having applied nothing
        self.partial: int | None = None  # once: apply this many, then raise PartialApplyError
        self.delay_s = 0.0  # per transaction

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        ids = [t.transaction_id for t in transactions]
        self.batches.append(ids)
        if self.fail_batches:
            self.fail_batches -= 1
            raise RuntimeError("application database is down")
        for applied, transaction in enumerate(transactions):
            if self.partial is not None and applied == self.partial:
                self.partial = None
                raise PartialApplyError(applied, RuntimeError("disk full"))
            time.sleep(self.delay_s)
            self.apply_transaction(transaction)


async def _fill(server: MockServer, count: int, partition: int = 0) -> None:
    async with client(server) as writer:
        futures = [await writer.submit(Ctx(b"w%d" % i, partition=partition)) for i in range(count)]
        assert all(await asyncio.gather(*futures))


def _applied_ids(callbacks: MemoryCallbacks, partition: int = 0) -> list[int]:
    return [txn_id for txn_id, _ in callbacks.applied.get(partition, [])]


@pytest.mark.callback_modes("thread")  # the data of another client's transactions is fetched
def test_a_catch_up_comes_in_feed_batches_in_order_with_its_data_read_a_batch_at_a_time() -> None:
    server = MockServer(1)
    server.feed_batch_size = 40

    async def scenario() -> BatchCallbacks:
        await _fill(server, 100)
        server.data_calls = server.read_calls = 0
        callbacks = BatchCallbacks()
        async with client(server, callbacks) as reader:
            await reader.wait_mounted()
            assert 1 <= reader.stats.apply_batches <= 3 and reader.stats.applied == 100
        return callbacks

    callbacks = run(scenario())
    # feed messages (40 each) that wait in the partition's inbox together are applied as one batch (issue 31)
    assert [i for batch in callbacks.batches for i in batch] == list(range(100))
    assert all(len(batch) % 40 == 0 or batch[-1] == 99 for batch in callbacks.batches)
    assert callbacks.applied[0] == [(i, b"w%d" % i) for i in range(100)]
    assert server.read_calls == len(callbacks.batches) and server.data_calls == 0  # one ReadTransactions a batch


def test_own_transactions_in_a_batch_end_true_with_their_hooks_around_the_apply() -> None:
    server = MockServer(1)
    events: list[tuple[Any, ...]] = []
    callbacks = BatchCallbacks(events)

    async def scenario() -> list[bool]:
        async with client(server, callbacks) as c:
            futures = [await c.submit(Ctx(b"m%d" % i, events=events)) for i in range(20)]
            return list(await asyncio.gather(*futures))

    assert run(scenario()) == [True] * 20
    assert _applied_ids(callbacks) == list(range(20))
    for i in range(20):
        data = b"m%d" % i
        completion = events.index(("completion", data, True))
        apply = events.index(("apply", 0, i, data))
        assert completion < apply < events.index(("application", data))
    assert sum(len(b) for b in callbacks.batches) == 20


@pytest.mark.callback_modes("thread")  # it fetches the writer's data
def test_a_batch_that_raises_is_reported_and_applied_again_whole() -> None:
    server = MockServer(1)
    callbacks = BatchCallbacks()
    callbacks.fail_batches = 2

    async def scenario() -> None:
        await _fill(server, 30)
        async with client(server, callbacks) as reader:
            await reader.wait_mounted()

    run(scenario())
    assert callbacks.batches[:3] == [list(range(30))] * 3
    assert _applied_ids(callbacks) == list(range(30))  # exactly once, in order
    assert [(p, t) for p, t, _ in callbacks.exceptions] == [(0, 0), (0, 0)]


@pytest.mark.callback_modes("thread")  # it fetches the writer's data
def test_a_partial_apply_error_counts_what_was_applied_and_retries_from_the_next() -> None:
    server = MockServer(1)
    callbacks = BatchCallbacks()
    callbacks.partial = 7

    async def scenario() -> None:
        await _fill(server, 20)
        async with client(server, callbacks) as reader:
            await reader.wait_mounted()
            assert reader.client_high_water_mark(0) == 19 and reader.stats.applied == 20

    run(scenario())
    assert callbacks.batches == [list(range(20)), list(range(7, 20))]
    assert _applied_ids(callbacks) == list(range(20))
    assert [(p, t, str(e)) for p, t, e in callbacks.exceptions] == [(0, 7, "disk full")]


@pytest.mark.callback_modes("thread")  # it fetches the writer's data
def test_callbacks_without_apply_transactions_are_called_per_transaction_as_before() -> None:
    server = MockServer(1)
    callbacks = MemoryCallbacks()
    callbacks.fail_next_applies = 1

    async def scenario() -> int:
        await _fill(server, 10)
        async with client(server, callbacks) as reader:
            await reader.wait_mounted()
            return reader.stats.apply_batches

    assert run(scenario()) == 0
    assert _applied_ids(callbacks) == list(range(10))
    assert [(p, t) for p, t, _ in callbacks.exceptions] == [(0, 0)]


def test_the_default_apply_transactions_applies_each_and_says_how_far_it_got() -> None:
    callbacks = MemoryCallbacks()
    transactions = [Transaction(0, i, None, 0, lambda: b"x") for i in range(5)]  # type: ignore[arg-type]
    callbacks.apply_transactions(transactions[:2])
    callbacks.hwm[0] = 3  # the next apply is out of order: the default stops there
    with pytest.raises(PartialApplyError) as raised:
        callbacks.apply_transactions(transactions[2:])
    assert raised.value.applied == 0 and isinstance(raised.value.error, AssertionError)
    assert _applied_ids(callbacks) == [0, 1]


class _SlowApply(MemoryCallbacks):
    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(0.01)
        super().apply_transaction(transaction)


@pytest.mark.callback_modes("thread")  # its applies block
def test_a_slow_catch_up_is_logged_scraped_and_named_by_the_mount_timeout(caplog: pytest.LogCaptureFixture) -> None:
    server = MockServer(1)
    server.feed_batch_size = 10
    registry = CollectorRegistry()
    remaining: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(0.05):
            remaining.append(value(samples(registry), "waltz_client_partition_catchup_remaining_transactions",
                                   partition="0"))

    async def scenario() -> tuple[str, float]:
        await _fill(server, 200)
        async with AsyncWaltzClient(_SlowApply(), {**FAST, "client.mountTimeout": 1.6}, driver=server,
                                    metrics_registry=registry) as reader:
            scraper = threading.Thread(target=scrape, daemon=True)
            scraper.start()
            try:
                with pytest.raises(WaltzTimeoutError) as raised:
                    await reader.wait_mounted()
                while reader.client_high_water_mark(0) != 199:  # the wait timed out, not the mount
                    await asyncio.sleep(0.05)
                await reader.wait_mounted()
            finally:
                stop.set()
                scraper.join(5)
            assert reader.client_high_water_mark(0) == 199
            final = value(samples(registry), "waltz_client_partition_catchup_remaining_transactions", partition="0")
        return str(raised.value), final

    with caplog.at_level(logging.INFO, logger="waltz_client.partition"):
        message, final = run(scenario())
    assert message.startswith("partition 0 was not mounted within 1.6 s (client.mountTimeout): still catching up "
                              "from mock:0: applied "), message
    assert " of 200 at " in message and "/s" in message and "a mount completes only once" in message, message
    progress = [r.getMessage() for r in caplog.records if "catching up from mock:0" in r.getMessage()]
    assert progress and " of 200 at " in progress[0] and " left" in progress[0], progress
    assert max(remaining) > 0 and final == 0
    assert server.high_water_mark_calls >= 1  # the catch-up's target, asked while mounting


def test_a_mount_nobody_answers_times_out_saying_so() -> None:
    server = MockServer(1)
    server.hold_requests()

    async def scenario() -> str:
        async with client(server, MemoryCallbacks(), **{"client.mountTimeout": 0.5}) as c:
            with pytest.raises(WaltzTimeoutError) as raised:
                await c.wait_mounted()
            server.release_requests()
            await c.wait_mounted()
        return str(raised.value)

    message = run(scenario())
    assert message.startswith("partition 0 was not mounted within 0.5 s (client.mountTimeout): no answer from "
                              "server mock:0 to the mount request for 0."), message
