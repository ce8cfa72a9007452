"""The append task's side of the store: the pipeline's batches sent in order, several in flight, and
their outcomes handed back in that same order."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic

from prometheus_client import Histogram

from waltz_server.append_pipeline import A, AppendPipeline, Resolved, Send
from waltz_server.store.api import AppendFailed, PendingRecord, StorePartition, StoreUnavailable

log = logging.getLogger(__name__)

RETRY_S = 0.05
GATHER_TURNS = 3
"""Loop turns a busy partition's next batch gathers for before it goes (AppendPipeline.pace: Send.NEXT_TURN). A
client message reaches submit a turn or two after its bytes arrive (gRPC's completion, then the stream's task), so
one turn left most of those arriving with a commit to the round after it: bench.round's open loop at 10,000/s
offered ran 39 appends per batch against the previous main's 83 (whose append task took the batch four turns
after the acknowledgement arrived, as this does now)."""


async def wait_store_ready(store: StorePartition) -> None:
    """Wait (for ever, retrying) until the store takes appends."""
    while True:
        try:
            await store.wait_ready()
            return
        except StoreUnavailable:
            await asyncio.sleep(RETRY_S)


class StoreBatches(Generic[A]):
    """Sends the batches the pipeline hands out, up to the pipeline's bound in flight, and resolves them oldest
    first: a commit at once (from the store's done callback), a failure in run(), because its outcome is only known
    once the next store session has recovered.

    A batch goes from the caller's stack (pump(): the client stream that offered the appends, or the commit that
    made room) with StorePartition.append_now whenever the store takes it without waiting; run() is woken only for
    what must wait (no session, a replica behind, a failure to resolve), and sends with begin_append. While a
    batch is in flight the next one gathers in the pipeline (group commit): pump() at its commit sends it.

    The order argument: a failed batch is resolved before anything is sent again, and the store fails
    every batch of a session together, so when the failure is resolved the store's high-water mark is
    exactly what the next session recovered. pump() sends nothing while run() holds a batch or resolves a failure.
    """

    def __init__(
        self,
        partition_id: int,
        store: StorePartition,
        pipeline: AppendPipeline[A],
        records_of: Callable[[list[A]], Sequence[PendingRecord]],
        apply: Callable[[Resolved[A]], None],
        sent: Callable[[list[A]], None],
        answer_lock_failures: Callable[[list[tuple[A, int]]], None],
        work: asyncio.Event,
        batch_sizes: Histogram | None = None,
    ) -> None:
        self._partition_id = partition_id
        self._store = store
        self._pipeline = pipeline
        self._records_of = records_of
        self._apply = apply
        self._sent = sent
        self._answer_lock_failures = answer_lock_failures
        self._work = work  # set by whoever offers appends to the pipeline, and here on every outcome
        self._batch_sizes = batch_sizes
        self._commits: deque[asyncio.Future[int]] = deque()  # the pipeline's in-flight batches, in order
        self._unsent: tuple[Sequence[PendingRecord], list[A]] | None = None
        """A batch taken from the pipeline that run() sends (its records and appends): pump() waits behind it."""
        self._resolving = False  # run() resolves a failed batch: nothing is sent meanwhile
        self._gathering = False  # a commit freed a slot while appends waited: they go at the loop's next turn
        self.closed = False

    def offered(self) -> None:
        """Appends were offered (and polled): send their batch as the pipeline's pace says (at once, at the loop's
        next turn, or when the commit that frees a slot in flight comes)."""
        pace = self._pipeline.pace()
        if pace is Send.NOW:
            self.pump()
        elif pace is Send.NEXT_TURN:
            self._gather()

    def pump(self) -> None:
        """Send the batches that can go now, from the caller's stack (appends were offered, or a batch resolved);
        wake run() for what cannot."""
        if self.closed or self._gathering:
            return
        if self._unsent is not None or self._resolving:
            self._work.set()
            return
        pipeline, commits = self._pipeline, self._commits
        while True:
            if commits and commits[0].done():  # resolved here when it committed (its callback finds it gone)
                self._resolve_commits()
                if commits and commits[0].done():  # it failed: run() resolves it
                    self._work.set()
                    return
            self._answer_lock_failures(pipeline.poll())  # (nothing to scan: at once)
            batch = pipeline.take_batch()
            if batch is None:
                return
            records = self._records_of(batch)
            committed = self._store.append_now(records)
            if committed is None:  # the store cannot take it without waiting: run() sends it
                self._unsent = (records, batch)
                self._work.set()
                return
            self._sending(committed, batch, len(records))

    def _sending(self, committed: asyncio.Future[int], batch: list[A], count: int) -> None:
        if self._batch_sizes is not None:
            self._batch_sizes.observe(count)
        self._commits.append(committed)
        committed.add_done_callback(self._store_done)
        # sent(), the batch's own work while the replicas write it (the framed connection wrote it already), only
        # if the batch is still at the store (else its outcome came first, as it may from a store in memory).
        if not committed.done():
            self._sent(batch)

    async def run(self) -> None:
        pipeline, commits = self._pipeline, self._commits
        while True:
            self._resolve_commits()
            if commits and commits[0].done():  # it failed: the store session ended
                self._resolving = True
                try:
                    await self._resolve_failure(commits.popleft())
                finally:
                    self._resolving = False
                continue
            if self._unsent is None:
                self._answer_lock_failures(pipeline.poll())
                batch = pipeline.take_batch()
                if batch is None:
                    self._work.clear()
                    await self._work.wait()
                    continue
                self._unsent = (self._records_of(batch), batch)
            records, taken = self._unsent
            try:
                committed = await self._store.begin_append(records)
            except StoreUnavailable:
                # Nothing was sent. Batches still in flight resolve first (if their session ended, the
                # next session's recovery tells which committed), then this one goes to the next session.
                if commits:
                    await asyncio.wait([commits[0]])
                else:
                    await wait_store_ready(self._store)
                continue
            self._unsent = None
            self._sending(committed, taken, len(records))

    def _store_done(self, _: asyncio.Future[int]) -> None:
        if not self.closed:
            self._resolve_commits()  # (a failed head wakes run() itself)
            if self._pipeline.untaken:
                # Room for another batch in flight, and appends waiting for it: sent at the loop's next turn, so
                # that the appends arriving in this one (the clients the commit's feed answers) join them.
                self._gather()

    def _gather(self) -> None:
        if not self._gathering and not self.closed:
            self._gathering = True
            asyncio.get_running_loop().call_soon(self._gathered, GATHER_TURNS - 1)

    def _gathered(self, turns: int) -> None:
        if turns > 0 and not self.closed:
            asyncio.get_running_loop().call_soon(self._gathered, turns - 1)
            return
        self._gathering = False
        self.pump()

    def _resolve_commits(self) -> None:
        """Publish the batches at the head of the in-flight queue that committed; leave a failed head
        to run() (resolving a failure waits for the next store session)."""
        commits = self._commits
        while commits and commits[0].done():
            head = commits[0]
            if head.cancelled() or head.exception() is not None:
                self._work.set()
                return
            commits.popleft()
            self._resolved(self._pipeline.committed(head.result()))

    async def _resolve_failure(self, failed: asyncio.Future[int]) -> None:
        failure = None if failed.cancelled() else failed.exception()
        if failure is not None and not isinstance(failure, AppendFailed):
            raise failure  # a bug in the store: the partition reports it through health
        if failure is None:
            raise RuntimeError(f"partition {self._partition_id}: a store append was cancelled")
        committed_up_to = failure.committed_up_to
        if committed_up_to is None:
            # Nothing was sent since this batch failed, so the next session's high-water mark is what it
            # recovered: the batch's records at or below it committed, the others never will.
            await wait_store_ready(self._store)
            committed_up_to = self._store.high_water_mark
        log.warning(
            "partition %d: batch from %d failed (%s); committed up to %d",
            self._partition_id,
            failure.first_transaction_id,
            failure,
            committed_up_to,
        )
        self._resolved(self._pipeline.failed(failure.first_transaction_id, committed_up_to))

    def _resolved(self, resolved: Resolved[A]) -> None:
        """The doomed appends' lock failures around the commits' publication (Resolved.answer_order): before it for a
        client with an append among the commits (it hears them in order), after it for the others."""
        before, after = resolved.answer_order()
        if before:
            self._answer_lock_failures(before)
        self._apply(resolved)
        if after:
            self._answer_lock_failures(after)
