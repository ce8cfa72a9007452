"""The shell of one partition: mounting, the reconnect procedure, append slots; the feed's apply is FeedApply's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any

from waltz.v1 import server_pb2
from waltz_client.api import TransactionBuilder, applies_batches
from waltz_client.applied_waiters import AppliedWaiters
from waltz_client.catchup import CatchUp, mount_wait_reason
from waltz_client.connection import ServerConnection
from waltz_client.driver import Ownership
from waltz_client.errors import (
    ClientAheadError,
    ClientIdDeniedError,
    StreamClosedError,
    TransactionRejectedError,
)
from waltz_client.feed_apply import FeedApply
from waltz_client.feed_apply import Verdict as _Verdict
from waltz_client.feed_intake import RECHECK, FeedIntake, merge_feeds
from waltz_client.feed_steps import FeedSteps
from waltz_client.monitor import OutcomeKind, TransactionMonitor
from waltz_client.own_locks import OwnLocks
from waltz_client.partition_env import PartitionEnv, PendingAppend
from waltz_client.partition_env import Stats as Stats  # where it was before partition_env.py
from waltz_client.partition_state import ClientPartitionState, MountResult, MountState
from waltz_client.slot_queue import SlotQueue
from waltz_client.slot_waits import SlotWaits
from waltz_client.wire import fill_append_requests, flush_request, mount_request, req_id_from_proto
from waltz_common.types import ReqId

log = logging.getLogger(__name__)

NOT_READY_RETRY_S = 0.5  # original: sleep 500 ms after NOT_READY, then find the owner again
INBOX_SIZE = 256
HIGH_WATER_MARK_ASK_S = 2.0  # while the inbox is backed up, the server's high-water mark is asked this often (lag)
_monotonic = time.monotonic  # what asyncio's loop.time() returns, without the two lookups

_MOUNT_RESULTS = {
    server_pb2.MountResponse.READY: MountResult.READY,
    server_pb2.MountResponse.NOT_READY: MountResult.NOT_READY,
    server_pb2.MountResponse.CLIENT_AHEAD: MountResult.CLIENT_AHEAD,
    server_pb2.MountResponse.PERMISSION_DENIED: MountResult.PERMISSION_DENIED,
}
_FINAL_REJECTIONS = {server_pb2.AppendRejected.INVALID, server_pb2.AppendRejected.PERMISSION_DENIED}
_REMOUNT_REJECTIONS = {
    server_pb2.AppendRejected.WRONG_GENERATION,
    server_pb2.AppendRejected.PARTITION_NOT_READY,
    server_pb2.AppendRejected.NOT_MOUNTED,
}


class ClientPartition(FeedApply, SlotWaits):
    """Runs one partition: owns its ClientPartitionState and TransactionMonitor (the decisions)."""

    def __init__(self, partition_id: int, env: PartitionEnv) -> None:
        self.partition_id = partition_id
        self.env = env
        self.state = ClientPartitionState(env.client_id, partition_id)
        self.monitor: TransactionMonitor[PendingAppend] = TransactionMonitor(env.config.max_concurrent_transactions)
        self.own_locks: OwnLocks[PendingAppend] = OwnLocks()  # appends parked behind this client's own (submission)
        self.inbox: asyncio.Queue[Any] = asyncio.Queue(INBOX_SIZE)
        self.error: BaseException | None = None
        self.conn: ServerConnection | None = None
        self._owner: Ownership | None = None
        # the slots of monitor's capacity and the submits waiting for one, first come, first served
        self.slots: SlotQueue[asyncio.Future[BaseException | None]] = SlotQueue(self.monitor.max_concurrent)
        self._slot_timer: asyncio.TimerHandle | None = None  # the oldest slot waiter's time-out (one for all)
        self._slot_timer_at = float("inf")
        self._last_flush = float("-inf")
        self._stalled_at: int | None = None
        self._changed = asyncio.Event()  # replaced at each change while _mount_waiters wait on it
        self._mount_waiters = 0
        self.server_high_water_mark = -1  # the highest id the client heard its server committed (metrics)
        self.mounts = 0  # READY mount answers (metrics: remounts are those after the first)
        self._batched = applies_batches(env.callbacks)  # apply_transactions overridden: one call per feed batch
        self._steps = FeedSteps(partition_id, env.callbacks)
        self.catchup: CatchUp | None = None  # the current mount's, while MOUNTING
        self._problem: str | None = None  # what ended the last mount attempt (for the mount timeout's message)
        self.apply_failure: tuple[int, BaseException] | None = None  # the apply failing now: (transaction id, error)
        self._backlog: deque[Any] = deque()  # inbox events taken out while merging feed messages, in order
        self._intake = FeedIntake(partition_id, env, self.monitor)  # feed entries -> steps, other clients' data
        self._inline_asked = 0  # the inline data the current feed was asked for
        self.applied_waiters = AppliedWaiters()  # AsyncWaltzClient.wait_applied's

    # ---- application side -------------------------------------------------------------

    @property
    def client_high_water_mark(self) -> int:
        return self.monitor.client_high_water_mark

    @property
    def applied_high_water_mark(self) -> int:
        """What the application's state holds, for an execute() on the callback thread: the feed steps move it
        there as soon as an apply returned, before the loop hears of it (client_high_water_mark)."""
        mark, applied = self.monitor._client_hwm, self._steps.applied  # (once per execute(): no calls)
        return mark if mark > applied else applied

    @property
    def mounted(self) -> bool:
        return self.state.appends_allowed and self.conn is not None and not self.conn.closed

    def try_acquire_slot(self) -> bool:
        """Take a pending slot if one is free now, nobody waits ahead, and the partition is mounted and not failed."""
        conn = self.conn  # can_append(), inline: once per submit
        return (self.error is None and self.state.appends_allowed and conn is not None and not conn.closed
                and self.slots.take(self.monitor.pending_count()))

    def hold_slot(self) -> None:
        """Take a slot whatever the capacity and the queue: for a retry, in the place its resolved entry just left."""
        self.slots.hold()

    def release_slot(self) -> None:
        self.slots.put_back()
        self._notify()

    def can_append(self) -> bool:
        """Mounted and not failed: a held slot can become an append at once (try_append)."""
        conn = self.conn
        return self.error is None and self.state.appends_allowed and conn is not None and not conn.closed

    async def wait_mounted(self) -> None:
        """Wait until appends are allowed (WaltzTimeoutError after client.mountTimeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.env.config.mount_timeout_s
        while True:
            if self.error is not None:
                raise self.error
            if self.mounted:
                return
            changed = self._changed
            self._mount_waiters += 1
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await changed.wait()
            except TimeoutError:
                error = self._not_mounted_error()
                raise error from error.__cause__  # (ApplyError's, not the TimeoutError)
            finally:
                self._mount_waiters -= 1

    def try_append(self, builder: TransactionBuilder, token: PendingAppend) -> bool:
        """Turn a held slot into a registered, queued append, if can_append() (else False)."""
        return self.try_append_all(((builder, token),))

    def try_append_all(self, appends: Sequence[tuple[TransactionBuilder, PendingAppend]]) -> bool:
        """try_append for each, in order: all of them, or none if not can_append() (False)."""
        conn, state = self.conn, self.state
        if self.error is not None or not state.appends_allowed or conn is None or conn.closed:
            return False
        client_id, generation, partition_id = state.client_id, state.generation, self.partition_id
        count = len(appends)
        self.slots.reserved -= count  # (slots.put_back(), inline; no grant: they are pending now)
        tokens = []
        now = _monotonic()  # the loop's clock
        for (builder, token), seq_num in zip(appends, state.next_seq_nums(count), strict=True):
            token.seq_num = seq_num
            token.client_id, token.generation, token.partition_id = client_id, generation, partition_id
            token.data, token.error, token.ended, token.sent_at, token.sent = builder.data, None, False, now, builder
            tokens.append(token)
        self.monitor.register_all(tokens, now)
        fill_append_requests(conn.new_appends(count), appends)
        return True

    def mount_wait_reason(self) -> str:
        """What the partition, not mounted, is waiting for (catchup.mount_wait_reason)."""
        owner = self.env.ownership(self.partition_id)
        return mount_wait_reason(self.state.mount_state, owner.endpoint if owner is not None else None, self.catchup,
                                 self.client_high_water_mark, _monotonic(), self._problem)

    def catchup_remaining(self) -> int:
        """Transactions still to apply before the partition is mounted: 0 when mounted; -1 while it is not and the
        target (the partition's high-water mark, asked of the server as the mount is sent) is not known yet."""
        if self.mounted:
            return 0
        catchup = self.catchup
        if catchup is None or catchup.target is None or self.state.mount_state is not MountState.MOUNTING:
            return -1
        return catchup.remaining(self.client_high_water_mark)

    def _notify(self) -> None:
        """Something changed (slots freed, mounted or not, failed): wake whoever it concerns."""
        if self.slots:  # somebody waits for a slot
            self._grant()
        if self._mount_waiters:
            self._changed.set()
            self._changed = asyncio.Event()

    def nudge(self, now: float, min_age: float, min_interval: float) -> None:
        """Send a flush when an append has waited min_age, so that a lost one is detected."""
        age = self.monitor.oldest_pending_age(now)
        if age is None or self.conn is None or not self.mounted:
            return
        if age < min_age or now - self._last_flush < min_interval:
            return
        target = self.monitor.flush_target()
        if target is not None:
            self.conn.enqueue(flush_request(target))
            self._last_flush = now

    def shutdown(self, error: BaseException) -> None:
        """Fail everything pending with error (the client is closing or the partition is dead)."""
        if self.error is None:
            self.error = error
        self._resolve(self.monitor.clear())
        self.applied_waiters.fail(error)
        for parked in self.own_locks.release_all():  # they execute again and meet the error
            parked.resume()
        self._notify()

    # ---- server side --------------------------------------------------------------------

    async def run(self) -> None:
        """Mount, serve, and remount after every loss, until shut down, CLIENT_AHEAD or PERMISSION_DENIED."""
        try:
            hwm = await self.env.call(self.env.callbacks.get_client_high_water_mark, self.partition_id)
            self.monitor.on_client_high_water_mark(hwm)
            self.applied_waiters.reached(hwm)
            while self.error is None:
                verdict = await self._mount_and_serve()
                self._notify()
                if verdict is _Verdict.NOT_READY:
                    self._problem = (f"server {self._owner.endpoint if self._owner else '?'} answered NOT_READY "
                                     "(the partition is not open there: recovering, or moving); mounting again")
                    await self._look_up_again(NOT_READY_RETRY_S)
        except (ClientAheadError, ClientIdDeniedError) as exc:
            log.error("%s", exc)
            self.shutdown(exc)
        except Exception as exc:
            log.exception("partition %d failed", self.partition_id)
            self.shutdown(exc)

    async def _mount_and_serve(self) -> _Verdict:
        owner = await self._wait_for_owner()
        assert owner.endpoint is not None
        self.state.update_generation(owner.generation)
        if self.state.mount_state is not MountState.UNMOUNTED:
            self.state.on_disconnect()
        try:
            conn = await self._connect(owner)
        except StreamClosedError as exc:
            log.info("partition %d: cannot reach %s: %s", self.partition_id, owner.endpoint, exc)
            self._problem = f"cannot reach server {owner.endpoint}: {exc}"
            self.env.refresh_topology()
            return _Verdict.REMOUNT
        if conn is None:
            return _Verdict.REMOUNT  # the partition moved while the stream was being opened
        self.conn, self._owner = conn, owner
        req_id = self.state.begin_mount()
        self._inline_asked = self._inline_wanted()
        conn.enqueue(mount_request(req_id, self.client_high_water_mark, conn.seq_num, self._inline_asked))
        loop = asyncio.get_running_loop()
        self.catchup = CatchUp(loop.time(), self.client_high_water_mark, conn.endpoint)
        reporter = loop.create_task(self._report_catchup(self.catchup), name=f"waltz-catchup-{self.partition_id}")
        asker = loop.create_task(self._ask_high_water_mark(conn), name=f"waltz-hwm-{self.partition_id}")
        try:
            return await self._serve(conn, owner)
        finally:
            reporter.cancel()
            asker.cancel()

    async def _ask_high_water_mark(self, conn: ServerConnection) -> None:
        """While this stream serves the partition: ask its server's high-water mark every HIGH_WATER_MARK_ASK_S while
        the inbox is half full or more, so that the lag metric is true when the stream itself is backed up (a unary
        call: not behind the feed). Otherwise every feed message is heard as it arrives: no call is needed."""
        ask = self.env.high_water_mark
        if ask is None:
            return
        while self.conn is conn:
            await asyncio.sleep(HIGH_WATER_MARK_ASK_S)
            if self.inbox.qsize() < INBOX_SIZE // 2:
                continue
            try:
                mark = await asyncio.wait_for(ask(conn.endpoint, self.partition_id), self.env.config.request_timeout_s)
            except Exception as exc:  # the metric goes without it this time
                log.debug("partition %d: no high-water mark from %s: %s", self.partition_id, conn.endpoint, exc)
                continue
            if self.conn is conn:
                self._heard_high_water_mark(mark)

    async def _report_catchup(self, catchup: CatchUp) -> None:
        """While this mount is MOUNTING: ask the server its high-water mark (the catch-up's target) now and then,
        and log the progress at INFO every env.progress_interval_s while there is a catch-up to show."""
        interval = self.env.progress_interval_s
        await self._ask_catchup_target(catchup)  # at once: the metric shows the catch-up from its start
        await asyncio.sleep(min(1.0, interval))  # a mount with little to catch up says nothing
        while self.catchup is catchup and self.state.mount_state is MountState.MOUNTING:
            await self._ask_catchup_target(catchup)
            hwm = self.client_high_water_mark
            if self.state.mount_state is MountState.MOUNTING and catchup.catching_up(hwm):
                log.info("partition %d: catching up from %s before the mount completes: %s", self.partition_id,
                         catchup.endpoint, catchup.describe(_monotonic(), hwm))
            await asyncio.sleep(interval)

    async def _ask_catchup_target(self, catchup: CatchUp) -> None:
        ask = self.env.high_water_mark
        if ask is not None:
            try:
                catchup.target = await asyncio.wait_for(ask(catchup.endpoint, self.partition_id),
                                                        self.env.config.request_timeout_s)
                self._heard_high_water_mark(catchup.target)
            except Exception as exc:  # the progress line goes without it; the mount has its own timeout
                log.debug("partition %d: no high-water mark from %s: %s", self.partition_id, catchup.endpoint, exc)

    async def _serve(self, conn: ServerConnection, owner: Ownership) -> _Verdict:
        """Handle the stream's messages for this partition until it must mount again (the verdict)."""
        loop = asyncio.get_running_loop()
        mount_deadline = loop.time() + self.env.config.request_timeout_s
        while True:
            if self._backlog:
                event = self._backlog.popleft()
            elif self.state.mount_state is not MountState.MOUNTING:
                event = await self.inbox.get()  # mounted: no deadline (and no timeout object per event)
            else:
                try:
                    async with asyncio.timeout(max(0.0, mount_deadline - loop.time())):
                        event = await self.inbox.get()
                except TimeoutError:
                    log.warning("partition %d: no mount response from %s; mounting again", self.partition_id,
                                conn.endpoint)
                    self._problem = (f"no answer from server {conn.endpoint} to a mount request within "
                                     f"{self.env.config.request_timeout_s:g} s (client.requestTimeout)")
                    self.state.on_disconnect()
                    return _Verdict.REMOUNT
            verdict = await self._handle(event)
            if verdict is None and self.env.ownership(self.partition_id) != owner:
                verdict = _Verdict.REMOUNT  # moved to another server, or a new generation
            if verdict is not None:
                self.state.on_disconnect()
                return verdict

    async def _look_up_again(self, at_most: float) -> None:
        """Ask where the partition is now, and go on as soon as the answer changes it (at most `at_most` s)."""
        changed = self.env.topology_changed()
        self.env.refresh_topology()
        if self.env.ownership(self.partition_id) == self._owner:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(at_most):
                    await changed.wait()

    async def _connect(self, owner: Ownership) -> ServerConnection | None:
        """The stream to owner, or None when the partition moved meanwhile (the connection manager may be
        backing off from a server that just died: its successor must not wait for that)."""
        assert owner.endpoint is not None
        getting = asyncio.ensure_future(self.env.connections.get(owner.endpoint))
        while not getting.done():
            changed = asyncio.ensure_future(self.env.topology_changed().wait())
            await asyncio.wait({getting, changed}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if not getting.done() and self.env.ownership(self.partition_id) != owner:
                getting.cancel()
                with contextlib.suppress(asyncio.CancelledError, StreamClosedError):
                    await getting
                return None
        return getting.result()

    async def _wait_for_owner(self) -> Ownership:
        while True:
            owner = self.env.ownership(self.partition_id)
            if owner is not None and owner.endpoint is not None:
                return owner
            await self.env.topology_changed().wait()

    async def _handle(self, event: Any) -> _Verdict | None:
        if event is RECHECK:
            return None  # the caller compares the ownership after every event
        conn, message = event
        if conn is not self.conn:
            return None  # from a stream this partition no longer uses
        if message is None:
            endpoint = self._owner.endpoint if self._owner else "?"
            self._problem = f"the stream to server {endpoint} ended; connecting again"
            self.env.refresh_topology()  # the stream broke: its server may be gone, ask where the partition is
            return _Verdict.REMOUNT  # reconnect procedure step 1: appends are blocked from here
        kind = message.WhichOneof("message")
        if kind == "feed":
            entries = merge_feeds(self.inbox, self._backlog, self._batched, conn, message.feed.transactions)
            return await self._on_feed(entries)
        if kind == "mount":
            return await self._on_mount(message.mount)
        elif kind == "flush":
            req_id = req_id_from_proto(message.flush.req_id)
            self._heard_high_water_mark(message.flush.transaction_id)
            self._check_feed_alive(message.flush.transaction_id)
            await self._fire(self.monitor.on_flush_response(
                req_id, message.flush.transaction_id, self.client_high_water_mark))
        elif kind == "append_rejected":
            rejected = message.append_rejected
            reason = server_pb2.AppendRejected.Reason.Name(rejected.reason)
            level = logging.INFO if rejected.reason == server_pb2.AppendRejected.ALREADY_COMMITTED else logging.WARNING
            log.log(level, "partition %d: append rejected: %s", self.partition_id, rejected.message)
            outcomes = self.monitor.on_rejected(req_id_from_proto(rejected.req_id), reason, rejected.transaction_id)
            if rejected.reason in _FINAL_REJECTIONS:  # retrying cannot help
                for token, _ in outcomes:
                    token.error = TransactionRejectedError(f"partition {self.partition_id}: {rejected.message}")
            await self._fire(outcomes)
            if rejected.reason in _REMOUNT_REJECTIONS:
                return _Verdict.REMOUNT
        return None

    def _heard_high_water_mark(self, high_water_mark: int) -> None:
        if high_water_mark > self.server_high_water_mark:
            self.server_high_water_mark = high_water_mark

    async def _on_mount(self, response: server_pb2.MountResponse) -> _Verdict | None:
        result = _MOUNT_RESULTS.get(response.state)
        if result is None:
            result = MountResult.READY if response.partition_ready else MountResult.NOT_READY
        if not self.state.on_mount_response(req_id_from_proto(response.req_id), result):
            return None
        if result is MountResult.NOT_READY:
            return _Verdict.NOT_READY
        if result is MountResult.CLIENT_AHEAD:
            raise ClientAheadError(self.partition_id, self.client_high_water_mark, response.high_water_mark)
        if result is MountResult.PERMISSION_DENIED:
            raise ClientIdDeniedError(self.partition_id, self.env.client_id, response.message)
        self.mounts += 1
        self._heard_high_water_mark(response.high_water_mark)
        self._problem = None
        catchup = self.catchup
        if catchup is not None and catchup.applied(self.client_high_water_mark) > 0:
            now = _monotonic()
            level = logging.INFO if now - catchup.started_at >= self.env.progress_interval_s else logging.DEBUG
            log.log(level, "partition %d: mounted on %s after catching up %s transactions in %.1f s", self.partition_id,
                    catchup.endpoint, f"{catchup.applied(self.client_high_water_mark):,}", now - catchup.started_at)
        # reconnect procedure step 5: the server decided every append of ours it had; those still pending are sent
        # again with their sequence numbers, before any new one (a remount proves nothing about them: see
        # TransactionMonitor), and the server answers ALREADY_COMMITTED for any that committed after all
        self._resend(self.monitor.take_resends(_monotonic()))
        await self._fire(self.monitor.on_mount_complete())
        self._notify()  # step 6: appends are unblocked; the server's feed goes on from here
        return None

    def _resend(self, tokens: list[PendingAppend]) -> None:
        conn = self.conn
        if not tokens or conn is None:
            return
        generation, now = self.state.generation, _monotonic()
        for token in tokens:
            token.generation, token.sent_at = generation, now
        fill_append_requests(conn.new_appends(len(tokens)), [(token.sent, token) for token in tokens])
        log.info("partition %d: sending %d pending appends again after the mount, with their sequence numbers "
                 "(%d..%d)", self.partition_id, len(tokens), tokens[0].seq_num, tokens[-1].seq_num)

    def deliver(self, conn: ServerConnection, message: server_pb2.ServerMessage | None) -> Awaitable[None] | None:
        """Called by the connection, in stream order: None once taken, or (the partition is behind: its inbox is
        full) the put to await before the stream's next message. A lock failure is
        settled at once (it decides nothing about the feed before it: the append waits in the monitor until
        the conflicting transaction is applied), and a feed message's last id is heard on arrival (the lag
        counts what is received but not applied yet)."""
        if conn is not self.conn:  # anything else is stale, and must not block the other partitions
            return None
        if message is not None:
            kind = message.WhichOneof("message")
            if kind == "lock_failure":
                failure = message.lock_failure
                self._on_lock_failure(req_id_from_proto(failure.req_id), failure.transaction_id)
                return None
            if kind == "feed":
                entries = message.feed.transactions
                if entries and entries[-1].transaction_id > self.server_high_water_mark:
                    self.server_high_water_mark = entries[-1].transaction_id
        inbox = self.inbox
        if inbox.full():  # (one stream delivers at a time: no put of this stream waits ahead of this one)
            return inbox.put((conn, message))
        inbox.put_nowait((conn, message))
        return None

    def _on_lock_failure(self, req_id: ReqId, transaction_id: int) -> None:
        """The monitor's notice, the on_lock_failure hooks queued on the callback thread (not awaited: the stream
        goes on), and the failures the applied high-water mark already allows resolved (their re-execution)."""
        sent_at = self.env.lock_failure_latency
        post = self.env.post_first or self.env.post  # ahead of the execute() calls waiting on the callback thread
        now = _monotonic()
        outcomes = self.monitor.on_lock_failure(req_id, transaction_id)
        for token, outcome in outcomes:
            if outcome.kind is OutcomeKind.LOCK_FAILED:
                self.env.stats.lock_failures += 1
                if sent_at is not None:
                    sent_at.observe(now - token.sent_at)
                post(self._steps.run_hook, token.context.on_lock_failure, "on_lock_failure", -1)
        self._resolve([(t, o) for t, o in outcomes if o.is_final])

    def recheck_owner(self) -> None:
        """The topology changed: wake the partition so it compares its ownership."""
        if self._owner is not None and self.env.ownership(self.partition_id) != self._owner:
            try:
                self.inbox.put_nowait(RECHECK)
            except asyncio.QueueFull:
                pass  # busy: it compares the ownership after the event it is handling
