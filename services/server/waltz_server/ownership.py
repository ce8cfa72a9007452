"""The partitions this server owns: open what it gained, close what it lost, follow generations.

A partition whose store was fenced by a newer owner (a replica refused its store session STALE_SESSION, or
ZooKeeper holds a higher generation) is closed at once, which tells its clients NOT_READY, even before the
new assignment arrives (this server may have been frozen, or cut off from ZooKeeper). It is not opened again
under the generation it was fenced at unless, after a delay, the assignment still gives it to this server at
that generation (then the store checks again); a higher generation opens it at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from waltz_server.cache_budget import CacheBudget
from waltz_server.config import DEFAULT_CACHE_BUDGET, PartitionSettings
from waltz_server.metrics import ServerMetrics
from waltz_server.partition import Partition
from waltz_server.store.api import StorePartition
from waltz_server.store.settings import Backoff

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
"""A failed partition is restarted after this long, twice as long after each failure in a row (at most
RESTART_DELAY_MAX_S); a failure more than twice that long after the one before starts again from here."""
RESTART_DELAY_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """What to do to go from the owned partitions to the assigned ones (partition id -> generation)."""

    open: dict[int, int] = field(default_factory=dict)
    close: list[int] = field(default_factory=list)
    regenerate: dict[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.open or self.close or self.regenerate)


def ownership_change(owned: Mapping[int, int], assigned: Mapping[int, int]) -> OwnershipChange:
    return OwnershipChange(
        open={p: g for p, g in sorted(assigned.items()) if p not in owned},
        close=sorted(p for p in owned if p not in assigned),
        regenerate={p: g for p, g in sorted(assigned.items()) if p in owned and owned[p] != g},
    )


class PartitionManager:
    """This server's Partition objects, created over stores from `store_factory`."""

    def __init__(
        self,
        num_partitions: int,
        store_factory: Callable[[int], StorePartition],
        settings: PartitionSettings,
        metrics: ServerMetrics | None = None,
        restart_delay_s: float = RESTART_DELAY_S,
        budget: CacheBudget | None = None,
    ) -> None:
        """budget: the cache budget the partitions share (None: one of its own, server.cacheBudgetBytes' default)."""
        self.num_partitions = num_partitions
        self.budget = budget if budget is not None else CacheBudget(DEFAULT_CACHE_BUDGET)
        self._store_factory = store_factory
        self._settings = settings
        self._metrics = metrics
        self._partitions: dict[int, Partition] = {}
        self._lock = asyncio.Lock()
        self._restart_delay_s = restart_delay_s
        self._restarts: dict[int, tuple[float, Backoff]] = {}  # partition -> (its last failure, its delays)
        self._restart_tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()  # close_all: restarts waiting for their delay give up
        self._assigned: dict[int, int] = {}  # the last assignment applied (partition id -> generation)
        self._fenced_at: dict[int, int] = {}  # partition id -> the generation a newer owner fenced it at
        self.fenced = 0  # partitions given up because a newer owner fenced them (metrics, tests)

    def get(self, partition_id: int) -> Partition | None:
        return self._partitions.get(partition_id)

    def all(self) -> list[Partition]:
        return [self._partitions[p] for p in sorted(self._partitions)]

    def owned(self) -> dict[int, int]:
        return {p: part.generation for p, part in self._partitions.items()}

    async def apply(self, assigned: Mapping[int, int]) -> OwnershipChange:
        """Own exactly the assigned partitions (id -> generation)."""
        async with self._lock:
            self._assigned = dict(assigned)
            fenced = self._fenced_at
            wanted = {p: g for p, g in assigned.items() if g > fenced.get(p, -1)}  # fenced: not at that generation
            for pid in [p for p in fenced if p in wanted]:
                del fenced[pid]
            change = ownership_change(self.owned(), wanted)
            # Together: a close may wait for its replicas (a short drain), and every client of every partition that
            # moved must hear NOT_READY now, not after the partitions closed before its own.
            closing = [self._partitions.pop(pid) for pid in change.close]
            for partition in closing:
                log.info("closing partition %d (assigned elsewhere)", partition.partition_id)
            await asyncio.gather(*(partition.close() for partition in closing))
            for pid, generation in change.regenerate.items():
                log.info("partition %d: generation %d", pid, generation)
                await self._partitions[pid].set_generation(generation)
            for pid, generation in change.open.items():
                log.info("opening partition %d at generation %d", pid, generation)
                await self._open(pid, generation)
            self._count()
            return change

    def _count(self) -> None:
        if self._metrics is not None:
            self._metrics.partitions.set(len(self._partitions))

    async def _open(self, pid: int, generation: int) -> None:
        metrics = self._metrics.for_partition(pid) if self._metrics is not None else None
        store = self._store_factory(pid)
        partition = Partition(pid, generation, store, self._settings, metrics, budget=self.budget)
        partition.on_failure = self._failed
        store.on_fenced = lambda reason: self._fenced(partition, reason)
        self._partitions[pid] = partition
        await partition.open()

    def _fenced(self, partition: Partition, reason: str) -> None:
        """A newer owner fenced the partition's store: stop serving it now (its clients hear NOT_READY and look
        for the new owner), and do not open it again under this generation unless it is still assigned here."""
        pid = partition.partition_id
        if self._partitions.get(pid) is not partition or self._fenced_at.get(pid) == partition.generation:
            return
        log.warning("partition %d: fenced by a newer owner at generation %d (%s): closing it", pid,
                    partition.generation, reason)
        self._fenced_at[pid] = partition.generation
        self.fenced += 1
        partition.failure = f"fenced by a newer owner: {reason}"
        self._failed(partition, fenced=True)

    def _failed(self, partition: Partition, fenced: bool = False) -> None:
        """A partition's task failed (a bug, reported by health meanwhile): close it, which answers its queued
        appends PARTITION_NOT_READY (their clients mount again), and open it anew after a delay."""
        now = asyncio.get_running_loop().time()
        found = self._restarts.get(partition.partition_id)
        last, backoff = found or (now, Backoff(self._restart_delay_s, RESTART_DELAY_MAX_S))
        if now - last > 2 * RESTART_DELAY_MAX_S:
            backoff.reset()  # not a failure in a row
        delay = backoff.next_delay()
        self._restarts[partition.partition_id] = (now, backoff)
        task = asyncio.get_running_loop().create_task(self._restart(partition, delay, fenced))
        self._restart_tasks.add(task)
        task.add_done_callback(self._restart_tasks.discard)

    async def _restart(self, partition: Partition, delay: float, fenced: bool = False) -> None:
        pid = partition.partition_id
        async with self._lock:
            if self._partitions.get(pid) is not partition:
                return  # closed or replaced meanwhile
            await partition.close()
            del self._partitions[pid]
            self._count()
        log.warning("partition %d: restarting in %.1f s after a failure (%s)", pid, delay, partition.failure)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)
        async with self._lock:
            if pid in self._partitions or self._stopping.is_set():
                return  # opened again by an assignment meanwhile, or the server is stopping
            if fenced:
                if self._assigned.get(pid) != partition.generation:
                    return  # assigned elsewhere (or under a newer generation, which apply opens)
                self._fenced_at.pop(pid, None)  # still ours in the assignment: try again (the store checks ZooKeeper)
            await self._open(pid, partition.generation)
            self._count()

    async def close_all(self) -> None:
        self._stopping.set()
        await asyncio.gather(*self._restart_tasks)
        await self.apply({})
