"""StoreSession: one store session of a partition: recovery driven by the recovery core, then quorum appends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Sized
from typing import TypeVar

from waltz.v1 import common_pb2
from waltz_server.fence_judgement import FenceJudgement, LeftOut, damage_restart
from waltz_server.pending_batch import storage_append_request
from waltz_server.record_runs import Run, empty_run, merge_runs, slice_run
from waltz_server.recovery import RecoveryManager, ReplicaFacts, ReplicaState
from waltz_server.store.api import AppendFailed, PendingRecord, StoreUnavailable
from waltz_server.store.connection import (
    Code,
    StorageConnection,
    StorageError,
    StorageRpcError,
)
from waltz_server.store.connections import StorageConnections
from waltz_server.store.events import Signal, first_to_end
from waltz_server.store.metadata import SessionStart
from waltz_server.store.replica_catch_up import ReplicaCatchUp
from waltz_server.store.replica_session import ReplicaSession
from waltz_server.store.session_end import (
    SessionEnded,
    SessionFailed,
    SessionFenced,
    SessionRestart,
    classify,
    end_reason,
    refused_by_replica,
)
from waltz_server.store.settings import Backoff, StoreSettings
from waltz_server.store.write_set import Member, WriteSet

log = logging.getLogger(__name__)

WriteStates = Callable[[Mapping[str, ReplicaState]], Awaitable[None]]
StillCurrent = Callable[[], Awaitable[bool]]
"""Whether ZooKeeper still holds this store session as the partition's newest (no other owner took over)."""
P = TypeVar("P", bound=Sized)
R = TypeVar("R")
T = TypeVar("T")
Fetch = Callable[[ReplicaSession, int, int], Awaitable[P]]
"""Reads at most so many items from an id off one replica: a part, shorter when the node answers in parts."""
Join = Callable[[int, list[P], int], R]
"""The parts read from an id as the answer, of that many items (the parts may hold more)."""


def _join_lists(first: int, parts: list[list[T]], count: int) -> list[T]:
    return parts[0][:count] if len(parts) == 1 else [item for part in parts for item in part][:count]


def _join_runs(first: int, parts: list[Run], count: int) -> Run:
    return slice_run(merge_runs(parts), 0, count) if parts else empty_run(first)


class StoreSession(ReplicaCatchUp):
    """One session: replica sessions, recovery, the write set, appends at a majority of all replicas, reads.

    run() drives it until it ends and then raises the SessionEnded reason. It is usable (append, reads)
    once ``ready`` is set and until it ends. A replica still catching up after ready keeps copying from a
    member of the write set and joins it once it holds the high-water mark; any member failing ends it.
    """

    def __init__(
        self,
        start: SessionStart,
        replicas: Iterable[str],
        connections: StorageConnections,
        settings: StoreSettings,
        write_states: WriteStates,
        on_change: Callable[[], None] = lambda: None,
        still_current: StillCurrent | None = None,
    ) -> None:
        self.start = start
        self.session_id = start.session_id
        self.partition_id = start.partition_id
        self.replicas = tuple(sorted(set(replicas)))
        self.quorum = len(self.replicas) // 2 + 1
        self._connections = connections
        self._settings = settings
        self._write_states = write_states
        self._on_change = on_change  # told when the session opens for appends and when it ends
        self._still_current = still_current
        self._fence = FenceJudgement(self.session_id, still_current is not None)
        self._manager = RecoveryManager(self.session_id, start.previous, self.replicas)
        self._changed = Signal()  # recovery facts or membership changed
        self._progress = Signal()  # a batch was acknowledged, or the session ended
        self._online: dict[str, ReplicaSession] = {}
        self._recovered: set[str] = set()
        self._writes = WriteSet(self.quorum, self._progress, settings.max_replica_backlog_bytes)
        self.backlog_waits = 0  # batches that had to wait for a replica's backlog to shrink
        self._append_lock = asyncio.Lock()  # ids are handed out in the order begin_append was called
        self._checkpointing = False  # the checkpoint interval is reached: no new appends, then restart
        self._stop: asyncio.Future[SessionEnded] = asyncio.get_running_loop().create_future()
        self._preferred_reader: str | None = None
        self._damage_seen = asyncio.Event()  # a read was answered CORRUPTED: look for damage now
        self.ready = asyncio.Event()
        self.ended: SessionEnded | None = None
        self.low_water_mark = -1
        self.replica_detail: dict[str, str] = dict.fromkeys(self.replicas, "connecting")

    # ----------------------------------------------------------------------------------- lifecycle

    @property
    def usable(self) -> bool:
        """Open for reads (and for appends unless a checkpoint is closing it)."""
        return self.ready.is_set() and self.ended is None and not self._stop.done()

    @property
    def appendable(self) -> bool:
        return self.usable and not self._checkpointing

    @property
    def restarting(self) -> bool:
        """A planned end was requested (checkpoint, reassignment, generation): a new session follows at once."""
        return self._checkpointing or (self._stop.done() and isinstance(self._stop.result(), SessionRestart))

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted(self._writes.members))

    @property
    def high_water_mark(self) -> int:
        """The highest committed transaction id of the session."""
        return self._writes.high_water_mark

    def request_end(self, reason: SessionEnded) -> None:
        """End the session soon (the first reason wins); it takes no new appends from now on."""
        if not self._stop.done():
            self._stop.set_result(reason)
            self._on_change()

    async def run(self) -> None:
        """Run the session until it ends; raises the SessionEnded reason (or CancelledError)."""
        try:
            async with asyncio.TaskGroup() as tasks:
                for replica in self.replicas:
                    tasks.create_task(self._replica_task(replica), name=f"replica {replica} p{self.partition_id}")
                tasks.create_task(self._coordinate())
                tasks.create_task(self._until_stopped())
                tasks.create_task(self._checkpoint())
                tasks.create_task(self._watch_lag())
                tasks.create_task(self._watch_damage())
        except BaseExceptionGroup as group:
            reason = end_reason(group)
            self._end(reason)
            raise reason from None
        finally:
            self._end(SessionRestart("store session closed"))
        raise SessionFailed("store session tasks ended")  # unreachable: the tasks never return

    def _end(self, reason: SessionEnded) -> None:
        if self.ended is not None:
            return
        self.ended = reason
        # Only the next session's recovery can tell which of these committed (committed_up_to None).
        self._writes.fail_all(lambda b: AppendFailed(f"store session {self.session_id} ended: {reason}", b.first))
        self._progress.notify()
        self._changed.notify()
        self._on_change()

    async def drain(self) -> None:
        """Wait until every member acknowledged every batch sent to it (or the session ended)."""
        await self._wait_until(self._progress, lambda: self.ended is not None or self._writes.drained())

    async def _until_stopped(self) -> None:
        # Shielded: when the task group tears down (a replica failed), cancelling this task must not
        # cancel _stop itself, or `restarting` and `_check_usable` would hand CancelledError to callers.
        raise await asyncio.shield(self._stop)

    async def _watch_lag(self) -> None:
        """End the session when a member stays behind a batch that a quorum acknowledged for longer than
        storage.replicaLagTimeout. A replica whose process or disk hangs keeps its connection up, so nothing
        else would end the session before the request timeout, and meanwhile it holds every append back once
        it has storage.maxReplicaBacklogBytes unacknowledged. The next session recovers without it, and it catches
        up from the others once it answers again."""
        lag = self._settings.replica_lag_timeout_s
        while True:
            await asyncio.sleep(lag / 4)
            late = self._writes.laggards(time.monotonic(), lag)
            if late:
                log.warning(
                    "partition %d session %d: replica %s has not acknowledged a batch %g s after a quorum did; "
                    "ending the session without it",
                    self.partition_id,
                    self.session_id,
                    ", ".join(late),
                    lag,
                )
                raise SessionFailed(f"replica {', '.join(late)} fell {lag:g} s behind the quorum's acknowledgements")

    async def _watch_damage(self) -> None:
        """Every storage.damageCheckIntervalSeconds (sooner after a read answered CORRUPTED), ask the members for
        damaged records; any ends the session, so that the next one's recovery repairs them from an intact
        replica before it takes appends (recovery.RecoveryManager, Repair)."""
        await self.ready.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.damage_check_interval_s):
                    await self._damage_seen.wait()
            self._damage_seen.clear()
            for replica, member in sorted(self._writes.members.items()):
                try:
                    _, damaged = await member.session.max_transaction_id_and_damage()
                except StorageError:
                    continue  # a failing member ends the session through its own task
                restart = damage_restart(replica, damaged)
                if restart is not None:
                    log.error(
                        "partition %d session %d: %s; a new session repairs them",
                        self.partition_id,
                        self.session_id,
                        restart,
                    )
                    raise SessionRestart(restart)

    async def _wait_until(self, signal: Signal, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await signal.wait_past(signal.version)

    # ----------------------------------------------------------------------------------- replicas

    async def _replica_task(self, replica: str) -> None:
        connection = self._connections.get(replica)
        try:
            await self._serve_replica_connection(replica, connection)
        finally:
            self._connections.release(replica)

    async def _serve_replica_connection(self, replica: str, connection: StorageConnection) -> None:
        backoff = Backoff.of(self._settings)
        while True:
            epoch = await connection.wait_connected()
            session = ReplicaSession(connection, epoch, self.partition_id, self.session_id)
            try:
                # Not a TaskGroup: see first_to_end (a cancelled session must not go on retrying here).
                await first_to_end(session.wait_lost(), self._serve_replica(replica, session))
                error: Exception = SessionFailed(f"replica {replica} stopped")
            except Exception as e:
                error = e
            self._online.pop(replica, None)
            reason = classify(error)
            if isinstance(reason, SessionFenced) and await self._poisoned(replica, error):
                self._manager.replica_offline(replica)
                self._changed.notify()
                await asyncio.sleep(self._settings.max_retry_interval_s)  # until an operator resets its fence
                continue
            if not isinstance(reason, SessionFailed) or not isinstance(error, StorageError):
                raise reason from None
            if replica in self._writes.members:
                raise SessionFailed(f"replica {replica} failed: {error}") from None
            log.info(
                "partition %d session %d: replica %s offline: %s",
                self.partition_id,
                self.session_id,
                replica,
                error,
            )
            self.replica_detail[replica] = f"offline: {error}"
            if replica not in self._recovered:
                self._manager.replica_offline(replica)
                self._changed.notify()
            await asyncio.sleep(backoff.next_delay())

    @property
    def poisoned(self) -> set[str]:
        """Replicas left out: their fence is above this session, which is the newest (fence_judgement)."""
        return self._fence.poisoned

    async def _poisoned(self, replica: str, error: BaseException) -> bool:
        """Whether replica refused this session for a poisoned fence (fence_judgement.FenceJudgement, with what
        ZooKeeper says); raises SessionFailed when it is a member of the write set (the next session leaves it
        out). False: the refusal stands."""
        if not self._fence.asks_zookeeper(refused_by_replica(error)) or self._still_current is None:
            return False
        try:
            newest: bool | None = await self._still_current()
        except Exception as e:  # ZooKeeper unreachable: cannot tell a poisoned fence from a newer owner
            log.warning("partition %d: cannot check the session in ZooKeeper: %s", self.partition_id, e)
            newest = None
        verdict = self._fence.judge(replica, str(error), newest, replica in self._writes.members)
        if not isinstance(verdict, LeftOut):
            return False
        if verdict.first:
            log.error(
                "partition %d session %d: replica %s %s", self.partition_id, self.session_id, replica, verdict.detail
            )
        self.replica_detail[replica] = verdict.detail
        if verdict.ends_session is not None:
            raise SessionFailed(verdict.ends_session)
        return True

    async def _serve_replica(self, replica: str, session: ReplicaSession) -> None:

        info = await session.last_session_info()
        max_id, damaged = await session.max_transaction_id_and_damage()
        self._online[replica] = session
        held = self.low_water_mark
        if replica in self._recovered:
            # Reconnected after recovery in this session: what it holds was copied from the write set.
            if info.session_id != self.session_id or max_id < self.low_water_mark:
                raise SessionFailed(f"replica {replica} lost what this session recovered on it")
            held = max_id
        else:
            facts = ReplicaFacts(
                info.session_id,
                info.low_water_mark,
                info.local_low_water_mark,
                max_id,
                frozenset(damaged),
                info.committed_high_water_mark,
            )
            self._manager.replica_online(replica, facts)
            self._changed.notify()
            await self._recover_replica(replica, session)
            self._recovered.add(replica)
            held = self._manager.high_water_mark if self._manager.high_water_mark is not None else held
        self.replica_detail[replica] = "recovered"
        await self._wait_until(self._changed, lambda: self.ready.is_set())
        if replica not in self._writes.members:
            await self._catch_up_and_join(replica, session, held)
        self.replica_detail[replica] = "in the write set"
        await self._writes.serve(self._writes.members[replica])

    async def _coordinate(self) -> None:
        """Write the replica states the core decides; open the session for appends once recovery completes."""
        written: dict[str, ReplicaState] | None = None
        while True:
            version = self._changed.version
            decision = self._manager.decide()
            if decision.replica_states is not None and dict(decision.replica_states) != written:
                states = dict(decision.replica_states)
                await self._write_states(states)
                written = states
            if decision.complete and not self.ready.is_set():
                online = [r for r in decision.recovered if r in self._online and self._online[r].alive]
                if len(online) >= self.quorum and decision.high_water_mark is not None:
                    self.low_water_mark = decision.high_water_mark
                    self._writes.open(decision.high_water_mark)
                    for replica in online:
                        self._writes.join(replica, self._online[replica], acked=decision.high_water_mark)
                    self.ready.set()
                    log.info(
                        "partition %d: store session %d open at high-water mark %d with %s",
                        self.partition_id,
                        self.session_id,
                        self.high_water_mark,
                        sorted(online),
                    )
                    self._changed.notify()
                    self._on_change()
                    continue
            await self._changed.wait_past(version)

    # ----------------------------------------------------------------------------------- appends

    def _check_usable(self) -> None:
        if self.ended is not None:
            raise StoreUnavailable(f"store session {self.session_id} ended: {self.ended}")
        if self._stop.done():
            raise StoreUnavailable(f"store session {self.session_id} is ending: {self._stop.result()}")
        if not self.ready.is_set():
            raise StoreUnavailable(f"store session {self.session_id} is recovering")

    def _check_appendable(self) -> None:
        self._check_usable()
        if self._checkpointing:
            raise StoreUnavailable(f"store session {self.session_id} is closing at a checkpoint")

    async def begin_append(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        """Send a batch to the write set behind the batches already sent; see StorePartition.begin_append.

        Waits while a member has storage.maxReplicaBacklogBytes unacknowledged (a replica that far behind holds appends
        back).
        StoreUnavailable (nothing was sent) when the session is not open for appends, or stops meanwhile.
        """
        if not records:
            raise ValueError("an append needs at least one record")
        self._check_appendable()
        async with self._append_lock:
            if not self._writes.has_room():
                self.backlog_waits += 1
            await self._wait_until(self._progress, lambda: not self.appendable or self._writes.has_room())
            self._check_appendable()
            return self._send(records)

    def append_now(self, records: Sequence[PendingRecord]) -> asyncio.Future[int] | None:
        """begin_append without waiting: None (nothing sent) when the session does not take appends, a member has
        its backlog bound unacknowledged, or a begin_append is under way (batches go in call order)."""
        if not records:
            raise ValueError("an append needs at least one record")
        if not self.appendable or self._append_lock.locked() or not self._writes.has_room():
            return None
        return self._send(records)

    def _send(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        # Each append tells the replicas the high-water mark: they refuse any truncation below it.
        return self._writes.send(
            len(records),
            lambda first: storage_append_request(self.session_id, self.partition_id, first, records,
                                                 self.high_water_mark),
        )

    async def append(self, records: Sequence[PendingRecord]) -> int:
        """begin_append, then wait for the commit; returns the first id. See StorePartition.append.

        Cancelling the wait leaves the batch in flight: it commits (or fails with the session) all the same.
        """
        return await asyncio.shield(await self.begin_append(records))

    async def _checkpoint(self) -> None:
        """Every storage.checkpointInterval transactions: stop taking appends, let the replicas acknowledge
        everything sent, and end the session so that the next one recovers (and sets a new low-water mark)."""
        interval = self._settings.checkpoint_interval
        await self.ready.wait()  # the low-water mark is set when the session opens
        await self._writes.reaching(self.low_water_mark + interval)
        self._checkpointing = True
        self._on_change()
        await self.drain()
        self.request_end(SessionRestart(f"checkpoint: {interval} transactions"))
        await asyncio.Future()  # the session ends now: wait to be cancelled with the other tasks

    # ----------------------------------------------------------------------------------- reads

    def _readers(self, last: int) -> list[tuple[str, Member]]:
        """Members holding last first (the one that answered last time first of all), then the others."""
        preferred = self._preferred_reader
        return sorted(self._writes.members.items(), key=lambda kv: (kv[1].acked < last, kv[0] != preferred, kv[0]))

    async def _read(self, first: int, max_records: int, fetch: Fetch[P], join: Join[P, R]) -> R:
        """Consecutive committed items from first (at most max_records), from the first member that has them all,
        fetched in parts and joined.

        A storage node answers long lists in parts, so a short, non-empty answer is followed up."""
        self._check_usable()
        count = min(max_records, self.high_water_mark - first + 1)
        if count <= 0 or first < 0:
            return join(first, [], 0)
        errors = []
        for replica, member in self._readers(first + count - 1):
            parts: list[P] = []
            found = 0
            try:
                while found < count:
                    part = await fetch(member.session, first + found, count - found)
                    if not part:
                        break
                    parts.append(part)
                    found += len(part)
            except StorageError as e:
                if isinstance(e, StorageRpcError) and e.code == Code.CORRUPTED:
                    self._damage_seen.set()
                errors.append(str(e))
                continue
            if found >= count:
                self._preferred_reader = replica
                return join(first, parts, count)
            errors.append(f"{replica}: {found} of {count} from {first}")
        raise StoreUnavailable(f"partition {self.partition_id}: no replica could serve {first}..: {'; '.join(errors)}")

    async def records(self, first: int, max_records: int) -> list[common_pb2.Record]:
        return await self._read(first, max_records, ReplicaSession.records, _join_lists)

    async def headers(self, first: int, max_records: int) -> list[common_pb2.RecordHeader]:
        return await self._read(first, max_records, ReplicaSession.headers, _join_lists)

    async def record_run(self, first: int, max_records: int) -> Run:
        """records() as one run (a raw read): the parts merged, nothing decoded."""
        return await self._read(first, max_records, ReplicaSession.record_run, _join_runs)

    # ----------------------------------------------------------------------------------- status

    def describe(self) -> str:
        if self.ended is not None:
            return f"store session {self.session_id} ended: {self.ended}"
        if self.ready.is_set():
            left_out = "".join(f"; {r} {self.replica_detail[r]}" for r in sorted(self.poisoned))
            return (
                f"store session {self.session_id} open: write set {', '.join(self.members)} "
                f"({len(self._writes.members)}/{len(self.replicas)}), high-water mark {self.high_water_mark}"
                f"{left_out}"
            )
        replicas = "; ".join(f"{r}: {d}" for r, d in sorted(self.replica_detail.items()))
        return f"store session {self.session_id} recovering ({self._manager.decide().resolution.value}): {replicas}"
