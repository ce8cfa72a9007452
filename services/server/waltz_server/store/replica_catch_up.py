"""A store session's replica recovery and catch-up: carrying out the recovery core's actions on one replica
(truncate, repair damaged records, set the low-water mark, copy from another replica), and copying committed
transactions to a replica until it joins the write set. StoreSession's, split out as a base class over the
state the session keeps (declared here)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from waltz_server.recovery import (
    CatchUp,
    Recovered,
    RecoveryManager,
    Repair,
    SetLowWaterMark,
    Truncate,
    Wait,
)
from waltz_server.store.connection import StorageError
from waltz_server.store.events import Signal
from waltz_server.store.replica_session import ReplicaSession
from waltz_server.store.session_end import SessionEnded
from waltz_server.store.settings import StoreSettings
from waltz_server.store.write_set import WriteSet

log = logging.getLogger(__name__)

SOURCE_RETRY_S = 0.05


class ReplicaCatchUp:
    """StoreSession's recovery of one replica and its catch-up to the write set (see StoreSession)."""

    partition_id: int
    session_id: int
    ended: SessionEnded | None
    replica_detail: dict[str, str]
    _settings: StoreSettings
    _manager: RecoveryManager
    _changed: Signal
    _progress: Signal
    _online: dict[str, ReplicaSession]
    _writes: WriteSet
    _append_lock: asyncio.Lock

    @property
    def high_water_mark(self) -> int:
        raise NotImplementedError

    async def _wait_until(self, signal: Signal, predicate: Callable[[], bool]) -> None:
        raise NotImplementedError

    async def _recover_replica(self, replica: str, session: ReplicaSession) -> None:
        """Carry out the recovery core's actions for replica until it says Recovered."""
        while True:
            version = self._changed.version
            action = self._manager.decide().actions[replica]
            if isinstance(action, Recovered):
                return
            if isinstance(action, Wait):
                self.replica_detail[replica] = f"waiting: {action.reason.value}"
                await self._changed.wait_past(version)
                continue
            self.replica_detail[replica] = f"recovering: {action}"
            if isinstance(action, Truncate):
                self._manager.replica_progress(replica, await session.truncate(action.transaction_id))
            elif isinstance(action, Repair):
                await self._repair(replica, session, action)
            elif isinstance(action, SetLowWaterMark):
                await session.set_low_water_mark(action.low_water_mark)
                self._manager.low_water_mark_set(replica)
            elif isinstance(action, CatchUp):
                copied_to = await self._copy_from(self._online.get(action.source), session, action.first, action.last)
                if copied_to is None:
                    await asyncio.sleep(SOURCE_RETRY_S)
                    continue
                self._manager.replica_progress(replica, copied_to)
            self._changed.notify()

    async def _repair(self, replica: str, target: ReplicaSession, action: Repair) -> None:
        """Read intact copies of the damaged transactions from the source and have the target rewrite them."""
        source = self._online.get(action.source)
        if source is None or not source.alive:
            await asyncio.sleep(SOURCE_RETRY_S)
            return
        copies = []
        for txn in action.transaction_ids:
            try:
                found = await source.records(txn, 1)
            except StorageError as e:  # the source's copy is damaged too: it says which of its records are
                log.warning("partition %d: repair read of %d from %s: %s", self.partition_id, txn, source.replica, e)
                _, damaged = await source.max_transaction_id_and_damage()
                self._manager.replica_damage(action.source, damaged)
                break
            if found and found[0].transaction_id == txn:
                copies.append(found[0])
        if copies:
            try:
                remaining = await target.repair(copies)
            except StorageError as e:  # e.g. the copy is not the record the target held: try again later
                log.error("partition %d: repair of %s on %s failed: %s", self.partition_id, replica, action, e)
                await asyncio.sleep(SOURCE_RETRY_S * 20)
                return
            log.warning(
                "partition %d session %d: repaired damaged transactions %s on %s from %s",
                self.partition_id,
                self.session_id,
                [c.transaction_id for c in copies],
                replica,
                action.source,
            )
            self._manager.replica_damage(replica, remaining)

    async def _copy_from(
        self, source: ReplicaSession | None, target: ReplicaSession, first: int, last: int
    ) -> int | None:
        """Copy one batch of first..last from source to target; the new max id, or None if source failed."""
        if source is None or not source.alive:
            return None
        count = min(self._settings.catch_up_batch_size, last - first + 1)
        try:
            records = await source.records(first, count)
        except StorageError as e:
            log.info("partition %d: catch-up read from %s failed: %s", self.partition_id, source.replica, e)
            return None
        if not records or records[0].transaction_id != first:
            return None
        await target.append(records)
        return int(records[-1].transaction_id)

    async def _catch_up_and_join(self, replica: str, session: ReplicaSession, held: int) -> None:
        """Copy committed transactions from the write set until replica holds the high-water mark, then join.

        The last stretch (at most one catch-up batch) is copied with appends held back: under the append
        lock, once the batches in flight have committed, the high-water mark stands still, so the replica
        joins even under a steady stream of appends. (Waiting for a moment with no batch in flight could
        wait for ever.)
        """
        while True:
            if self.ended is not None:
                raise self.ended
            self.replica_detail[replica] = f"catching up: holds {held}, high-water mark {self.high_water_mark}"
            if self.high_water_mark - held <= self._settings.catch_up_batch_size:
                async with self._append_lock:
                    await self._wait_until(self._progress, lambda: self.ended is not None or not self._writes.inflight)
                    while held < self.high_water_mark and self.ended is None:
                        copied_to = await self._copy_committed(session, held)
                        if copied_to is None:
                            break
                        held = copied_to
                    if held == self.high_water_mark and self.ended is None:
                        self._writes.join(replica, session, acked=held)
                        log.info(
                            "partition %d session %d: replica %s caught up at %d and joined the write set",
                            self.partition_id,
                            self.session_id,
                            replica,
                            held,
                        )
                        self._changed.notify()
                        return
                await asyncio.sleep(SOURCE_RETRY_S)  # no source could serve the rest: try again shortly
                continue
            copied_to = await self._copy_committed(session, held)
            if copied_to is None:
                await self._wait_until(self._progress, partial(self._moved_past, held))
                await asyncio.sleep(SOURCE_RETRY_S)
            else:
                held = copied_to

    async def _copy_committed(self, session: ReplicaSession, held: int) -> int | None:
        """Copy one batch of committed transactions above held from the member that holds the most;
        the new max id, or None when no member can serve any now."""
        # Only committed transactions (at or below the high-water mark) are copied.
        sources = sorted(self._writes.members.values(), key=lambda m: -m.acked)
        limit = min(sources[0].acked, self.high_water_mark) if sources else held
        if limit <= held:
            return None
        return await self._copy_from(sources[0].session, session, held + 1, limit)

    def _moved_past(self, held: int) -> bool:
        return self.ended is not None or self.high_water_mark > held
