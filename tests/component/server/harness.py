"""Open a Partition over a FakeStore for component tests, and run coroutines with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from waltz_common.types import Record, ReqId, crc32
from waltz_server.config import PartitionSettings
from waltz_server.partition import Partition

from .fakes import FakeStore, FakeStream

SMALL = PartitionSettings(feed_cache_size=1000, feed_batch_size=1000, feed_fetch_size=5000)


def run(test: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(test(), timeout)

    return asyncio.run(bounded())


def stored(count: int, partition_id: int = 0) -> list[Record]:
    """count committed records, as if appended earlier by client 99."""
    return [Record(i, ReqId(99, 1, partition_id, i + 1), i, b"r%d" % i, crc32(b"r%d" % i)) for i in range(count)]


async def opened(
    store: FakeStore | None = None, settings: PartitionSettings = SMALL, generation: int = 1
) -> tuple[Partition, FakeStore]:
    store = store or FakeStore(0)
    partition = Partition(store.partition_id, generation, store, settings)
    await partition.open()
    await partition.wait_ready(10)
    return partition, store


async def settle(rounds: int = 20) -> None:
    """Let every ready task run a few times."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def mounted_client(
    store: FakeStore | None = None, settings: PartitionSettings = SMALL, generation: int = 1
) -> tuple[Partition, FakeStore, FakeStream]:
    """An open partition with client 1 mounted on a fresh stream (its mount answered)."""
    from .helpers import mount

    partition, store = await opened(store, settings, generation)
    stream = FakeStream()
    partition.mount(stream, mount(generation=generation))
    await stream.wait_for(lambda s: s.of("mount"))
    return partition, store, stream
