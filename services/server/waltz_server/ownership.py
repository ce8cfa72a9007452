"""The partitions this server owns: open what it gained, close what it lost, follow generations."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from waltz_server.config import PartitionSettings
from waltz_server.metrics import ServerMetrics
from waltz_server.partition import Partition
from waltz_server.store.api import StorePartition

log = logging.getLogger(__name__)


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
    ) -> None:
        self.num_partitions = num_partitions
        self._store_factory = store_factory
        self._settings = settings
        self._metrics = metrics
        self._partitions: dict[int, Partition] = {}
        self._lock = asyncio.Lock()
        self._paused = False

    def get(self, partition_id: int) -> Partition | None:
        return self._partitions.get(partition_id)

    def all(self) -> list[Partition]:
        return [self._partitions[p] for p in sorted(self._partitions)]

    def owned(self) -> dict[int, int]:
        return {p: part.generation for p, part in self._partitions.items()}

    async def apply(self, assigned: Mapping[int, int]) -> OwnershipChange:
        """Own exactly the assigned partitions (id -> generation)."""
        async with self._lock:
            change = ownership_change(self.owned(), assigned)
            for pid in change.close:
                log.info("closing partition %d (assigned elsewhere)", pid)
                await self._partitions.pop(pid).close()
            for pid, generation in change.regenerate.items():
                log.info("partition %d: generation %d", pid, generation)
                await self._partitions[pid].set_generation(generation)
            for pid, generation in change.open.items():
                log.info("opening partition %d at generation %d", pid, generation)
                metrics = self._metrics.for_partition(pid) if self._metrics is not None else None
                partition = Partition(pid, generation, self._store_factory(pid), self._settings, metrics)
                if self._paused:
                    partition.pause()
                self._partitions[pid] = partition
                await partition.open()
            if self._metrics is not None:
                self._metrics.partitions.set(len(self._partitions))
            return change

    async def close_all(self) -> None:
        await self.apply({})

    def pause(self) -> None:
        """Hold appends on every partition (ZooKeeper connection suspended)."""
        self._paused = True
        for partition in self._partitions.values():
            partition.pause()

    def resume(self) -> None:
        self._paused = False
        for partition in self._partitions.values():
            partition.resume()
