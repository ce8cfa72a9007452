"""Background scrubbing: re-read every record of every partition at a bounded rate, so rot is found early."""

from __future__ import annotations

import asyncio
import logging
import time

from waltz_storage.errors import StorageError
from waltz_storage.node import StorageNode

log = logging.getLogger(__name__)

MAX_STEP_BYTES = 1 << 20
"""Bytes one scrub step reads at most: a step runs on the partition's thread, between its requests."""


class Scrubber:
    """Every interval_s, one pass over every open partition's records, reading at most bytes_per_second.

    Each step checks a stretch of records one by one on the partition's own thread (so it never races a
    write), records the damage it finds there (reported like damage found at start: StoragePartition.
    damaged_transaction_ids, the waltz_storage_damaged_records gauge) and counts the bytes read. A server's
    store session asks for damage every storage.damageCheckIntervalSeconds and repairs it through recovery.
    """

    def __init__(self, node: StorageNode, bytes_per_second: int, interval_s: float) -> None:
        if bytes_per_second <= 0:
            raise ValueError("scrubbing needs a positive rate")
        self._node = node
        self._rate = bytes_per_second
        self._interval_s = interval_s
        self._step = min(MAX_STEP_BYTES, bytes_per_second)
        self.passes = 0

    async def run(self) -> None:
        """Scrub pass after pass until cancelled."""
        while True:
            started = time.monotonic()
            for partition_id, _ in self._node.manager.open_partitions():
                await self._scrub_partition(partition_id)
            self.passes += 1
            await asyncio.sleep(max(0.0, self._interval_s - (time.monotonic() - started)))

    async def _scrub_partition(self, partition_id: int) -> None:
        txn = 0
        while True:
            try:
                txn, size, _ = await self._node.run(partition_id, self._scrub_step, partition_id, txn)
            except StorageError as e:  # unassigned or closed meanwhile, or its files fail: the next pass tries again
                log.info("partition %d: scrubbing stopped: %s", partition_id, e)
                return
            self._node.metrics.scrubbed_bytes.inc(size)
            if txn == 0:
                return
            await asyncio.sleep(size / self._rate)

    def _scrub_step(self, partition_id: int, txn: int) -> tuple[int, int, list[int]]:
        return self._node.manager.partition(partition_id).scrub(txn, self._step)
