"""The lag an operator sees is the lag the application has (issue 31): with a slow apply, the client's lag metric
counts what it received and has not applied, at every scrape; and its callback thread's queue and busy time show
a thread that cannot keep up."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, eventually, run
from tests.component.client.test_client_metrics import samples, value
from waltz_client import AsyncWaltzClient, MockServer, Transaction

APPEND = 120
APPLY_S = 0.02


class _SlowApply(MemoryCallbacks):
    """Applies one transaction every APPLY_S: a reader that falls behind a fast writer on purpose."""

    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(APPLY_S)
        super().apply_transaction(transaction)


@pytest.mark.callback_modes("thread")  # its applies block
def test_the_lag_metric_follows_a_slow_apply_within_one_scrape() -> None:
    server = MockServer(1)
    registry = CollectorRegistry()

    async def scenario() -> list[tuple[float, int, int]]:
        reader_callbacks = _SlowApply()
        async with AsyncWaltzClient(reader_callbacks, FAST, driver=server, metrics_registry=registry) as reader, \
                AsyncWaltzClient(MemoryCallbacks(), FAST, driver=server) as writer:
            await reader.wait_mounted()
            await writer.wait_mounted()
            for i in range(APPEND):  # one at a time: a feed message each, as a steady writer makes them
                assert await writer.submit_and_wait(Ctx(b"w%d" % i))
            written = await writer.high_water_mark(0)
            seen = []  # (the scraped lag, what the reader had applied before and after the scrape)
            queues: list[float] = []
            while reader.client_high_water_mark(0) < written - APPEND // 3:
                before = reader.client_high_water_mark(0)
                scrape = await asyncio.to_thread(samples, registry)
                after = reader.client_high_water_mark(0)
                seen.append((value(scrape, "waltz_client_partition_lag_transactions", partition="0"), before, after))
                queues.append(value(scrape, "waltz_client_callback_queue_length"))
                await asyncio.sleep(0.1)
            assert max(queues) >= 1  # an apply waiting or running
            busy = value(await asyncio.to_thread(samples, registry), "waltz_client_callback_busy_seconds_total")
            assert busy >= APPLY_S * APPEND / 3  # the thread's time in the applies shows
            await eventually(lambda: reader.client_high_water_mark(0) == written, timeout=30)
            caught_up = await asyncio.to_thread(samples, registry)
            assert value(caught_up, "waltz_client_partition_lag_transactions", partition="0") == 0
            return [(lag, written - before, written - after) for lag, before, after in seen]

    seen = run(scenario())
    assert seen, "the reader caught up before a scrape: make the apply slower"
    for lag, most, least in seen:  # the true lag during the scrape was between least and most
        assert least <= lag <= most, seen  # issue 31: it read 0-3 while the reader was 100 behind
