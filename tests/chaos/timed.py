"""Inflict a fault on a cluster under load, hold it, heal it, and read off the recovery (tests/chaos/timing.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from tests.chaos.cluster import until
from tests.chaos.timing import Recovery, recovery


class Load(Protocol):
    """A Writer or several (tests/chaos/cluster.Writer, test_zookeeper_faults.Writers)."""

    @property
    def acknowledged(self) -> int: ...

    def acknowledgement_times(self) -> list[float]: ...

    def partitions_acknowledged_since(self, moment: float) -> set[int]: ...

    async def acknowledged_at_least(self, count: int, what: str, timeout: float = 120.0) -> int: ...


async def timed_fault(
    load: Load,
    kind: str,
    inflict: Callable[[], object],
    heal: Callable[[], object],
    hold: float | Callable[[], Awaitable[object]],
    after: int,
    settle: Callable[[], Awaitable[object]] | None = None,
    timeout: float = 120.0,
    partitions: int = 0,
) -> tuple[Recovery, int]:
    """Inflict (in a thread: it may wait for a process), hold it (seconds, or until an awaitable ends), heal,
    await settle (e.g. healthy owners), then wait for `after` more acknowledged appends within timeout and, given
    partitions, for one on each (those in flight at the healing may all be on partitions the fault spared). The
    recovery, and the appends acknowledged while the fault was held."""
    fault_at = time.monotonic()
    before = load.acknowledged
    await asyncio.to_thread(inflict)
    try:
        await (asyncio.sleep(hold) if isinstance(hold, float | int) else hold())
    finally:
        during = load.acknowledged - before
        await asyncio.to_thread(heal)
    healed_at = time.monotonic()
    acked = load.acknowledged
    if settle is not None:
        await settle()
    await load.acknowledged_at_least(acked + after, f"{after} after {kind} healed", timeout)
    if partitions:
        await until(
            lambda: len(load.partitions_acknowledged_since(healed_at)) >= partitions,
            f"an acknowledged append on each of the {partitions} partitions after {kind} healed",
            timeout,
        )
    return recovery(kind, load.acknowledgement_times(), fault_at, healed_at), during
