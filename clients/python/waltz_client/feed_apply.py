"""A partition's feed batches applied: the feed's decisions made (FeedIntake), the steps run on the callback thread
(FeedSteps), the applied ones settled (the client high-water mark, their appends' outcomes), the feed kept alive."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from waltz.v1 import server_pb2
from waltz_client.api import Transaction
from waltz_client.applied_waiters import AppliedWaiters
from waltz_client.connection import ServerConnection
from waltz_client.feed_intake import FeedIntake
from waltz_client.feed_steps import FeedStep, FeedSteps
from waltz_client.monitor import Outcome, OutcomeKind, TransactionMonitor
from waltz_client.partition_env import PartitionEnv, PendingAppend
from waltz_client.partition_state import ClientPartitionState, FeedDecision
from waltz_client.wire import feed_request

log = logging.getLogger("waltz_client.partition")  # the partition's log, as before the split

APPLY_RETRY_MAX_S = 5.0


class Verdict(Enum):
    """Why a partition's serve loop returns: it must mount again."""

    REMOUNT = "remount"
    NOT_READY = "not_ready"


class FeedApply:
    """ClientPartition's feed side (a mixin: the state is the partition's, declared here for the type checker)."""

    partition_id: int
    env: PartitionEnv
    state: ClientPartitionState
    monitor: TransactionMonitor[PendingAppend]
    conn: ServerConnection | None
    server_high_water_mark: int
    apply_failure: tuple[int, BaseException] | None
    applied_waiters: AppliedWaiters
    _batched: bool
    _steps: FeedSteps
    _intake: FeedIntake
    _inline_asked: int
    _stalled_at: int | None

    if TYPE_CHECKING:
        @property
        def client_high_water_mark(self) -> int: ...

        def _notify(self) -> None: ...

    def _inline_wanted(self) -> int:
        """The inline data to ask the feed for: client.inlineDataMaxBytes once the application read another client's
        data (0 before: a client that never reads it is not sent it)."""
        return self.env.config.inline_data_max_bytes if self._intake.reads_data else 0

    def _ask_inline(self) -> None:
        """The application reads other clients' data and the feed does not carry it yet: ask for it from here (a
        Feed Request from the applied high-water mark; what the old feed still sends is known, and skipped)."""
        wanted = self._inline_wanted()
        if wanted and not self._inline_asked and self.conn is not None and self.state.appends_allowed:
            self._inline_asked = wanted
            self.conn.enqueue(feed_request(self.state.next_req_id(), self.client_high_water_mark, wanted))

    def _check_feed_alive(self, server_high_water_mark: int) -> None:
        """Two flush answers ahead of a client that did not move: ask for the feed again."""
        hwm = self.client_high_water_mark
        if server_high_water_mark <= hwm:
            self._stalled_at = None
        elif self._stalled_at != hwm:
            self._stalled_at = hwm
        elif self.conn is not None:
            log.warning("partition %d: the feed stalled at %d (server at %d); requesting it again",
                        self.partition_id, hwm, server_high_water_mark)
            self._inline_asked = self._inline_wanted()
            self.conn.enqueue(feed_request(self.state.next_req_id(), hwm, self._inline_asked))
            self._stalled_at = None

    async def _on_feed(self, entries: Sequence[server_pb2.FeedData]) -> Verdict | None:
        """Apply a feed batch in order: the decisions here, the application's side in one callback-thread call."""
        if entries and entries[-1].transaction_id > self.server_high_water_mark:
            self.server_high_water_mark = entries[-1].transaction_id
        next_id = self.client_high_water_mark + 1  # the transaction to apply next
        intake = self._intake
        plain, source = intake.plain(entries, next_id, self._inline_asked > 0)
        if plain and len(plain) == len(entries):  # the catch-up case: no step of its own for any entry
            if intake.reads_data:
                await intake.read_ahead_of(plain)
                self._ask_inline()
            await self._apply_steps(plain, plain=True)
            return None
        steps, superseded, gap_at, foreign, last_foreign = intake.steps(entries, next_id, plain, source)
        pid = self.partition_id
        if foreign:
            log.error("partition %d: ignored %d feed entries of other partitions (a feed batch must carry one "
                      "partition's entries)", pid, foreign)
        if intake.reads_data and last_foreign >= 0:
            await intake.read_ahead(steps)
            self._ask_inline()
        await self._apply_steps(steps)
        await self._fire(superseded)
        if gap_at is not None and self.state.accept_feed(gap_at, self.client_high_water_mark) is FeedDecision.GAP:
            log.warning("partition %d: feed skipped to %d past %d; remounting",
                        self.partition_id, gap_at, self.client_high_water_mark)
            return Verdict.REMOUNT
        return None

    async def _apply_steps(self, steps: list[FeedStep] | list[Transaction], plain: bool = False) -> None:
        """Run the steps on the callback thread; an apply that raises is retried with backoff (skipping
        it would lose it), and the steps before it are settled first. plain: steps are plain_transactions'."""
        index = completed = 0
        delay = 0.1
        feed_steps = self._steps
        if plain:
            run: Callable[..., tuple[int, int, BaseException | None]] = (
                feed_steps.run_plain_batch if self._batched else feed_steps.run_plain)
            settle: Callable[[Any, int, int], None] = self._settle_plain
        else:
            run, settle = feed_steps.run_batch if self._batched else feed_steps.run_steps, self._settle
        while index < len(steps):
            if self._batched and (plain or any(step[2] is not None for step in steps[index:])):  # type: ignore[index]
                self.env.stats.apply_batches += 1  # an apply_transactions call (steps of own appends fed again: none)
            reached, completed, error = await self.env.call_first(run, steps, index, completed)
            settle(steps, index, reached)
            index = reached
            if error is None:
                if self.apply_failure is not None:
                    self.apply_failure = None
                return
            step = steps[index]
            failed = step.transaction_id if isinstance(step, Transaction) else step[0]
            self.apply_failure = (failed, error)  # what waits for the mount then raises it (ApplyError)
            log.error("partition %d: applying transaction %d failed; retrying in %.1f s",
                      self.partition_id, failed, delay, exc_info=error)
            await self._report(failed, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, APPLY_RETRY_MAX_S)

    def _settle(self, steps: list[FeedStep], start: int, end: int) -> None:
        """steps[start:end] ran: count them, move the client high-water mark, resolve their appends."""
        applied = committed = 0
        last_applied = -1
        ended: list[PendingAppend] = []  # the appends committed now, in feed order, and their ids: one commit_all
        ids: list[int] = []
        kind: type[PendingAppend] | None = None  # their class, while they are all of one
        mixed = False
        for txn_id, mine, transaction in steps[start:end]:
            if transaction is not None:
                applied += 1
                last_applied = txn_id
            if mine is not None:
                committed += 1
                if not mine.ended:
                    mine.ended = True
                    ended.append(mine)
                    ids.append(txn_id)
                    if type(mine) is not kind:
                        mixed, kind = kind is not None, type(mine)
        if ended:  # commit() and commit_all() do not raise (settle() may: _resolve guards it)
            if mixed:
                for token, txn_id in zip(ended, ids, strict=True):
                    type(token).commit_all((token,), (txn_id,))
            else:
                type(ended[0]).commit_all(ended, ids)
        stats = self.env.stats
        stats.applied += applied
        stats.committed += committed
        if committed:
            self._notify()
        if applied:
            self._resolve(self.monitor.on_client_high_water_mark(last_applied))
            if self.applied_waiters:
                self.applied_waiters.reached(last_applied)

    def _settle_plain(self, transactions: list[Transaction], start: int, end: int) -> None:
        """_settle for plain_transactions: transactions[start:end] were applied."""
        if end > start:
            self.env.stats.applied += end - start
            self._resolve(self.monitor.on_client_high_water_mark(transactions[end - 1].transaction_id))
            if self.applied_waiters:
                self.applied_waiters.reached(transactions[end - 1].transaction_id)

    async def _hook(self, hook: Callable[..., None], txn_id: int, *args: Any) -> None:
        try:
            await self.env.call(hook, *args)
        except Exception as exc:
            log.error("partition %d: context hook %s raised", self.partition_id, hook.__name__, exc_info=exc)
            await self._report(txn_id, exc)

    async def _report(self, txn_id: int, exc: BaseException) -> None:
        try:
            await self.env.call(self.env.callbacks.uncaught_exception, self.partition_id, txn_id, exc)
        except Exception:
            log.exception("uncaught_exception callback raised")

    async def _fire(self, outcomes: list[tuple[PendingAppend, Outcome]]) -> None:
        for token, outcome in outcomes:
            if outcome.kind is OutcomeKind.LOCK_FAILED:
                self.env.stats.lock_failures += 1
                await self._hook(token.context.on_lock_failure, -1)
            elif outcome.kind is OutcomeKind.COMMITTED and outcome.transaction_id is not None:
                # committed as a transaction the client applied already (ALREADY_COMMITTED to a re-send)
                self.env.stats.committed += 1
                await self._hook(token.context.on_completion, outcome.transaction_id, True)
        self._resolve([(t, o) for t, o in outcomes if o.is_final])

    def _resolve(self, outcomes: list[tuple[PendingAppend, Outcome]]) -> None:
        for token, outcome in outcomes:
            if outcome.kind is OutcomeKind.FAILED:
                self.env.stats.failed_appends += 1
            if not token.ended:
                token.ended = True
                try:
                    token.settle(outcome)
                except Exception:
                    log.exception("partition %d: handling an append's outcome failed", self.partition_id)
        if outcomes:
            self._notify()
