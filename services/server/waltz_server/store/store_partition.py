"""ReplicatedStorePartition: the StorePartition of one partition, opening store session after store session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from waltz.v1 import common_pb2
from waltz_common.types import Record
from waltz_common.zk import ZkPaths
from waltz_server.record_runs import Run
from waltz_server.recovery import ReplicaState
from waltz_server.store.api import PendingRecord, StoreStatus, StoreUnavailable
from waltz_server.store.connections import StorageConnections
from waltz_server.store.events import Signal
from waltz_server.store.metadata import (
    GenerationMismatch,
    SessionStart,
    begin_session,
    groups_of,
    read_replica_states,
    replicas_of,
    write_replica_states,
)
from waltz_server.store.session_end import SessionEnded, SessionFailed, SessionFenced, SessionRestart
from waltz_server.store.settings import STORE_KEYS, Backoff, StoreSettings
from waltz_server.store.store_session import StoreSession
from waltz_server.store.wire import record_from_proto

__all__ = ["STORE_KEYS", "ReplicatedStorePartition", "StoreSettings"]

log = logging.getLogger(__name__)

CLOSE_DRAIN_S = 5.0


class ReplicatedStorePartition:
    """One partition's log replicated over its assigned storage nodes (the StorePartition contract).

    A background task opens store sessions one after another: each takes a new session id by CAS in
    ZooKeeper (refusing, and staying unhealthy, if ZooKeeper holds a higher generation), recovers, then
    serves appends and reads. The replica assignment and group descriptor are watched (kazoo DataWatch):
    a change of this partition's replicas or of their groups starts a new session.
    """

    def __init__(
        self,
        partition_id: int,
        *,
        zk: KazooClient,
        paths: ZkPaths,
        connections: StorageConnections,
        settings: StoreSettings | None = None,
    ) -> None:
        self.partition_id = partition_id
        self._zk = zk
        self._paths = paths
        self._connections = connections
        self._settings = settings or connections.settings
        self._generation = -1
        self._high_water_mark = -1
        self._session: StoreSession | None = None
        self._last_session_id = -1
        self._backlog_waits_before = 0  # batches that waited for a far-behind replica, in sessions that ended
        self._state = Signal()  # session opened or ended, generation or replicas changed, closed
        self._assignments: bytes | None = None
        self._groups: bytes | None = None
        self._watching: set[str] = set()  # the znodes with a registered DataWatch
        self._seen: set[str] = set()  # the znodes whose data arrived
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._fenced: str | None = None
        self._planned_restart = False
        self._detail = "not started"
        self._last_ready_session = -1
        self.on_fenced: Callable[[str], None] | None = None
        """Told (on the loop) when a newer owner fenced this one: a replica refused the session STALE_SESSION, or
        ZooKeeper holds a higher generation. The owner stops serving the partition at once (docs/failover.md)."""

    # ----------------------------------------------------------------------------------- lifecycle

    @property
    def high_water_mark(self) -> int:
        # The open session's mark is read here, not copied on each commit (a callback per batch): it only holds
        # what its write set committed, and the session's last is kept when it ends.
        session = self._session
        return self._high_water_mark if session is None else max(self._high_water_mark, session.high_water_mark)

    async def start(self, generation: int) -> None:
        if self._task is not None or self._closed:
            raise RuntimeError(f"store partition {self.partition_id} was already started")
        self._generation = generation
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"store partition {self.partition_id}")

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Register the DataWatches (kazoo's thread calls them; they hop into the loop)."""

        def watcher(kind: str) -> Any:
            def changed(data: bytes | None, _stat: ZnodeStat | None) -> bool:
                if self._closed:
                    return False
                with contextlib.suppress(RuntimeError):  # the loop is gone: nothing left to tell
                    loop.call_soon_threadsafe(self._on_metadata, kind, data)
                return True

            return changed

        for kind, path in (("assignment", self._paths.replica_assignments), ("group", self._paths.group_descriptor)):
            if kind not in self._watching:
                DataWatch(self._zk, path, watcher(kind))
                self._watching.add(kind)

    def _on_metadata(self, kind: str, data: bytes | None) -> None:
        before = self._replica_groups()
        if kind == "assignment":
            self._assignments = data
        else:
            self._groups = data
        self._seen.add(kind)
        session = self._session
        if session is not None and self._replica_groups() != before:
            session.request_end(SessionRestart("the partition's replicas or their groups changed"))
        self._state.notify()

    def _replica_groups(self) -> dict[str, int]:
        groups = groups_of(self._groups)
        return {r: groups.get(r, -1) for r in replicas_of(self._assignments, self.partition_id)}

    async def set_generation(self, generation: int) -> None:
        if generation <= self._generation:
            return
        self._generation = generation
        self._fenced = None
        if self._session is not None:
            self._session.request_end(SessionRestart(f"generation changed to {generation}"))
        self._state.notify()

    async def wait_ready(self, timeout: float | None = None) -> None:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if self._closed:
                        raise StoreUnavailable(f"store partition {self.partition_id} is closed")
                    session = self._session
                    if session is not None and session.appendable:
                        return
                    await self._state.wait_past(self._state.version)
        except TimeoutError:
            raise StoreUnavailable(
                f"partition {self.partition_id}: no store session within {timeout} s: {self._describe()}"
            ) from None

    async def close(self) -> None:
        """Stop: let the replicas acknowledge what was sent to them (briefly), then cancel everything."""
        session = self._session
        if session is not None and not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_DRAIN_S):
                    await session.drain()
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._state.notify()

    # ----------------------------------------------------------------------------------- sessions

    async def _run(self) -> None:
        backoff = Backoff.of(self._settings)
        while True:
            try:
                await asyncio.to_thread(self._watch, asyncio.get_running_loop())
                break
            except Exception as e:  # ZooKeeper unreachable: the watches fire once it is back
                self._detail = f"cannot watch the replica assignment: {e}"
                log.warning("partition %d: %s", self.partition_id, self._detail)
                await asyncio.sleep(backoff.next_delay())
        await self._state_until(lambda: len(self._seen) == 2)
        while not self._closed:
            if self._connections.closed:
                self._detail = "the storage connections are closed"
                return
            if self._fenced is not None:
                await self._state_until(lambda: self._fenced is None)
                continue
            replica_groups = self._replica_groups()
            if not replica_groups:
                self._detail = "no storage node is assigned this partition"
                await self._state.wait_past(self._state.version)
                continue
            try:
                start = await asyncio.to_thread(
                    begin_session, self._zk, self._paths, self.partition_id, self._generation
                )
            except GenerationMismatch as e:
                self._fenced = str(e)
                log.warning("partition %d: %s; stopping until the generation goes up", self.partition_id, e)
                self._tell_fenced(str(e))
                continue
            except Exception as e:  # ZooKeeper unreachable or metadata damaged: try again later
                self._detail = f"cannot start a store session: {e}"
                log.warning("partition %d: %s", self.partition_id, self._detail)
                await asyncio.sleep(backoff.next_delay())
                continue
            try:
                reason = await self._run_session(start, replica_groups)
            except Exception as e:  # a bug: say so, and let the next session recover
                log.exception("partition %d: store session %d failed", self.partition_id, start.session_id)
                reason = SessionFailed(f"unexpected {type(e).__name__}: {e}")
            self._detail = f"store session {start.session_id} ended: {reason}"
            if self._closed:
                return
            if self._last_ready_session == start.session_id:
                backoff.reset()
            if isinstance(reason, SessionRestart):
                continue
            log.info("partition %d: %s", self.partition_id, self._detail)
            await asyncio.sleep(backoff.next_delay())

    async def _run_session(self, start: SessionStart, replica_groups: dict[str, int]) -> SessionEnded:
        version = start.version

        async def write_states(states: Mapping[str, ReplicaState]) -> None:
            nonlocal version
            version = await asyncio.to_thread(write_replica_states, self._zk, self._paths, start, version, states)

        async def still_current() -> bool:
            def read() -> bool:
                self._zk.sync(self._paths.partition_metadata(self.partition_id))
                generation, session_id, _ = read_replica_states(self._zk, self._paths, self.partition_id)
                return (generation, session_id) == (start.generation, start.session_id)

            return await asyncio.to_thread(read)

        session = StoreSession(
            start,
            replica_groups,
            self._connections,
            self._settings,
            write_states,
            self._session_changed,
            still_current,
        )
        self._session = session
        if self._replica_groups() != replica_groups:  # changed while the session id was being taken
            session.request_end(SessionRestart("the partition's replicas or their groups changed"))
        self._last_session_id = start.session_id
        self._state.notify()
        try:
            await session.run()
        except SessionEnded as e:
            reason = e
        else:
            reason = SessionFailed("store session ended")
        finally:
            self._high_water_mark = max(self._high_water_mark, session.high_water_mark)
            self._backlog_waits_before += session.backlog_waits
            self._session = None
            self._state.notify()
        self._planned_restart = isinstance(reason, SessionRestart)
        if isinstance(reason, SessionFenced):
            log.warning("partition %d: fenced: %s", self.partition_id, reason)
            self._tell_fenced(str(reason))
        return reason

    def _tell_fenced(self, reason: str) -> None:
        if self.on_fenced is not None and not self._closed:
            self.on_fenced(reason)

    def _session_changed(self) -> None:
        session = self._session
        if session is not None and session.usable:
            self._high_water_mark = max(self._high_water_mark, session.high_water_mark)
            self._last_ready_session = session.session_id
            self._planned_restart = False
        self._state.notify()

    async def _state_until(self, predicate: Any) -> None:
        while not predicate() and not self._closed:
            await self._state.wait_past(self._state.version)

    # ----------------------------------------------------------------------------------- data

    def _usable_session(self) -> StoreSession:
        session = self._session
        if session is None or not session.usable:
            raise StoreUnavailable(f"partition {self.partition_id}: {self._describe()}")
        return session

    async def begin_append(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        """See StorePartition.begin_append."""
        session = self._session
        if session is None or not session.appendable:
            raise StoreUnavailable(f"partition {self.partition_id}: {self._describe()}")
        return await session.begin_append(records)

    def append_now(self, records: Sequence[PendingRecord]) -> asyncio.Future[int] | None:
        """See StorePartition.append_now."""
        session = self._session
        return None if session is None else session.append_now(records)

    async def append(self, records: Sequence[PendingRecord]) -> int:
        """See StorePartition.append. During a planned session change (checkpoint, reassignment, new
        generation) it first waits up to storage.requestTimeoutSeconds for the next session."""
        session = self._session
        planned = self._planned_restart or (session is not None and session.restarting)
        if planned and (session is None or not session.appendable):
            with contextlib.suppress(StoreUnavailable):
                await self.wait_ready(self._settings.request_timeout_s)
        return await asyncio.shield(await self.begin_append(records))

    async def get_record(self, transaction_id: int) -> Record | None:
        if transaction_id > self.high_water_mark or transaction_id < 0:
            return None
        found = await self._usable_session().records(transaction_id, 1)
        return record_from_proto(found[0]) if found else None

    async def get_records(self, transaction_id: int, max_records: int) -> Sequence[common_pb2.Record]:
        return await self._usable_session().records(transaction_id, max_records)

    async def get_run(self, transaction_id: int, max_records: int) -> Run:
        return await self._usable_session().record_run(transaction_id, max_records)

    async def get_headers(self, transaction_id: int, max_records: int) -> Sequence[common_pb2.RecordHeader]:
        return await self._usable_session().headers(transaction_id, max_records)

    # ----------------------------------------------------------------------------------- status

    def _describe(self) -> str:
        if self._closed:
            return "closed"
        if self._fenced is not None:
            return f"not the owner: {self._fenced}"
        session = self._session
        return session.describe() if session is not None else self._detail

    def write_set(self) -> tuple[str, ...]:
        """The replicas that hold every committed transaction and take every append (empty between sessions)."""
        session = self._session
        return session.members if session is not None and session.usable else ()

    def status(self) -> StoreStatus:
        session = self._session
        replicas = sorted(self._replica_groups())
        connected = 0
        for replica in replicas:
            connected += self._connections.is_connected(replica)
        return StoreStatus(
            session_id=self._last_session_id,
            high_water_mark=self.high_water_mark,
            healthy=session is not None and session.usable and self._fenced is None and not self._closed,
            detail=self._describe(),
            replicas_connected=connected,
            replicas_total=len(replicas),
            replicas_in_write_set=len(write_set := self.write_set()),
            write_set=write_set,
            backlog_waits=self._backlog_waits_before + (session.backlog_waits if session is not None else 0),
        )
