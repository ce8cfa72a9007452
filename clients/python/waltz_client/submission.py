"""One submitted transaction, from its first execute to its future's end (retries included)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from waltz_client.api import TransactionBuilder, TransactionContext
from waltz_client.errors import RetriesExhaustedError, WaltzClosedError
from waltz_client.monitor import LOCK_FAILURE, Outcome, OutcomeKind
from waltz_client.partition import ClientPartition
from waltz_client.partition_env import PendingAppend, Stats
from waltz_client.tasks import CallbackThread, Job, TaskSet

log = logging.getLogger(__name__)

_Future = asyncio.Future


@dataclass(slots=True)
class Submitter:
    """What every submission of one client shares."""

    callback_thread: CallbackThread
    tasks: TaskSet  # the tasks of submissions off the common path; close() waits for them
    stats: Stats
    max_retries: int  # client.maxRetries: failed attempts before giving up (negative: never)
    pending: int = 0  # submissions not ended yet (even if the application cancelled their futures)
    _drained: asyncio.Event = field(default_factory=asyncio.Event)  # set when pending reaches 0
    _loop: asyncio.AbstractEventLoop | None = None  # the client's (bind)
    _plain_futures: bool = False  # its create_future is BaseEventLoop's: a Future made directly is the same

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop of every submission; asyncio.get_running_loop() is a system call (getpid) on Linux."""
        self._loop = loop
        self._plain_futures = type(loop).create_future is asyncio.BaseEventLoop.create_future

    def start(self, context: TransactionContext, partition: ClientPartition) -> asyncio.Future[bool]:
        """Run the submission, for which a slot of the partition is held; the future it ends with."""
        loop = self._loop
        assert loop is not None, "bind() first"
        future: asyncio.Future[bool] = _Future(loop=loop) if self._plain_futures else loop.create_future()
        self.pending += 1
        self.callback_thread.schedule(_Submission(self, context, partition, future))
        return future

    def ended(self) -> None:
        """A submission ended (once each)."""
        self.pending -= 1
        if not self.pending:
            self._drained.set()

    async def wait_drained(self, timeout: float) -> None:
        """Wait (at most timeout seconds) until no submission is pending."""
        if self.pending:
            self._drained.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._drained.wait()
            except TimeoutError:
                pass

    async def hook(self, hook: Callable[..., None], *args: Any) -> None:
        try:
            await self.callback_thread.call(hook, *args)
        except Exception:
            log.exception("context hook %s raised", getattr(hook, "__name__", hook))


class _Submission(PendingAppend, Job):
    """The common path (execute returns True, the partition is mounted, the append commits) runs
    as callbacks on the event loop with no task of its own: execute on the callback thread, then
    the append queued at once, then the future resolved when the partition settles the commit.
    Anything else (a decline, an error, waiting for a mount, a retry) goes on in a task.

    Made with a slot held, ready to execute: schedule it on the callback thread (run, then done)."""

    __slots__ = ("attempts", "builder", "future", "partition", "submitter")

    def __init__(self, submitter: Submitter, context: TransactionContext, partition: ClientPartition,
                 future: asyncio.Future[bool]) -> None:
        # PendingAppend.__init__ inline, and the first execute()'s builder: the common path makes no other call
        self.context = context
        self.error: BaseException | None = None
        self.ended = False
        self.submitter = submitter
        self.partition = partition
        self.future = future
        self.attempts = 0  # failed attempts so far
        self.builder: TransactionBuilder | None = TransactionBuilder(partition.partition_id, -1)  # mark: run()

    def execute(self) -> None:
        """With a slot held: build the append on the callback thread (run, then done)."""
        self.builder = TransactionBuilder(self.partition.partition_id, -1)  # its mark: run()
        self.submitter.callback_thread.schedule(self)

    def run(self) -> Any:
        builder = self.builder
        assert builder is not None  # set until done
        # the state execute() reads now: what the callback thread applied so far (a mark taken when the job was
        # scheduled would be older, and every lock taken on it would fail against what was applied meanwhile)
        builder.client_high_water_mark = self.partition.applied_high_water_mark
        return self.context.execute(builder)

    def done(self, ok: bool, value: Any) -> None:
        builder, self.builder = self.builder, None
        assert builder is not None
        if ok and value is True and self._parks(builder):
            return
        if not (ok and value and self.partition.try_append(builder, self)):
            self._spawn(self._after_execute(builder, ok, value))

    def _parks(self, builder: TransactionBuilder) -> bool:
        """Whether the append just built waits (parked, its slot held) for one of this client's own pending appends
        that holds one of its locks (OwnLocks); if not, it holds its write locks from now on (and any other lock it
        held, handed to it while parked, goes on to the next one parked behind it). Admitting again is a no-op."""
        write, read = builder._write_locks, builder._read_locks
        own_locks = self.partition.own_locks
        if not (write or read or own_locks.holds(self)):
            return False
        admitted, handed = own_locks.admit(self, write or (), read or ())
        for token in handed:
            token.resume()
        return not admitted

    def resume(self) -> None:
        """Parked (OwnLocks): handed the lock it waited for; execute again."""
        self.execute()

    def _release_locks(self) -> None:
        """Ended, or about to execute again: each lock it holds goes to the first append parked behind it, which
        executes again (OwnLocks.release). Called in every end path: one missed leaves those parked for ever."""
        for token in self.partition.own_locks.release(self):
            token.resume()

    @classmethod
    def done_all(cls, jobs: list[Job], values: list[Any]) -> None:
        """A batch of submissions only: done() for each, and the common case (execute returned True, one
        partition) appended in one pass."""
        appends: list[tuple[TransactionBuilder, _Submission]] = []
        partition: ClientPartition | None = None
        others = []
        idle = False  # the partition's OwnLocks has no holder and nothing parked: appends without locks skip _parks
        for job, value in zip(cast(list[_Submission], jobs), values, strict=True):
            if value is True and (job.partition is partition or partition is None):
                if partition is None:
                    partition = job.partition
                    idle = partition.own_locks.idle()
                builder = job.builder
                assert builder is not None  # set until done
                if builder._write_locks or builder._read_locks or not idle:
                    parks = job._parks(builder)
                    idle = partition.own_locks.idle()
                    if parks:
                        job.builder = None
                        continue
                appends.append((builder, job))
                job.builder = None
            else:
                others.append((job, value))
        if partition is not None and not partition.try_append_all(appends):
            others[:0] = [(job, True) for _, job in appends]  # mounted no more: they wait for the mount
            for builder, job in appends:
                job.builder = builder
        Job.done_all([job for job, _ in others], [value for _, value in others])

    async def _after_execute(self, builder: TransactionBuilder, ok: bool, value: Any) -> None:
        """The slot is still held: release it, or turn it into an append once mounted."""
        partition = self.partition
        try:
            try:
                if not ok:
                    raise value if value is not None else WaltzClosedError("the client was closed")
                if not value:
                    partition.release_slot()
                    self.submitter.stats.declined += 1
                    await self.submitter.hook(self.context.on_completion, False)
                    self._set(False)
                    return
                await partition.wait_mounted()
                while not partition.try_append(builder, self):  # only if lost again before this ran
                    await partition.wait_mounted()
            except BaseException:
                partition.release_slot()
                self._release_locks()  # (cancelled: _fail does not run)
                raise
        except Exception as exc:
            await self._fail(exc)

    def commit(self, transaction_id: int) -> None:
        """The common path ends here (_set(True), inline)."""
        self.context.committed_transaction_id = transaction_id
        self._release_locks()
        submitter = self.submitter
        submitter.pending -= 1
        if not submitter.pending:
            submitter._drained.set()
        try:
            self.future.set_result(True)
        except asyncio.InvalidStateError:  # the application cancelled it
            pass

    @classmethod
    def commit_all(cls, tokens: Sequence[PendingAppend], transaction_ids: Sequence[int]) -> None:
        """commit() for each (submissions of one partition, so of one client and one Submitter), in order: the
        own-lock release only while the partition's OwnLocks is in use, the pending count once."""
        submissions = cast(Sequence[_Submission], tokens)
        first = submissions[0]
        if not first.partition.own_locks.idle():
            for submission in submissions:
                submission._release_locks()
        submitter = first.submitter
        submitter.pending -= len(submissions)
        if not submitter.pending:
            submitter._drained.set()
        for submission, transaction_id in zip(submissions, transaction_ids, strict=True):
            submission.context.committed_transaction_id = transaction_id
            future = submission.future
            if not future.done():  # the application may have cancelled it
                future.set_result(True)

    def settle(self, outcome: Outcome) -> None:
        """The append's final outcome (from the partition): its locks go on, whether it ends or executes again."""
        self._release_locks()
        if outcome.kind is OutcomeKind.COMMITTED:
            if outcome.transaction_id is not None:
                self.context.committed_transaction_id = outcome.transaction_id
            self._set(True)  # the common path ends here
        else:
            # the slot its entry held passes to the retry at once: a retry that queued for a slot with every new
            # submission could wait behind them for ever, with the transaction that failed it long applied
            self.partition.hold_slot()
            self._spawn(self._retry(outcome))

    async def _retry(self, outcome: Outcome) -> None:
        """The append failed (its slot held again): give up, or execute again (it then sees the client's
        state at least as fresh as what the monitor waited for)."""
        partition = self.partition
        try:
            if partition.error is not None:
                raise partition.error
            if self.error is not None:
                raise self.error
            self.attempts += 1
            max_retries = self.submitter.max_retries
            if 0 <= max_retries < self.attempts:
                raise RetriesExhaustedError(
                    f"partition {partition.partition_id}: gave up after {self.attempts} failed attempts "
                    f"(client.maxRetries={max_retries}); last: {outcome.reason}")
            self.submitter.stats.retries += 1
            # a lock failure is the normal course under contention (waltz_client_lock_failures counts them): DEBUG
            log.log(logging.DEBUG if outcome.reason.startswith(LOCK_FAILURE) else logging.INFO,
                    "partition %d: the attempt with sequence number %d failed (%s); executing it again",
                    partition.partition_id, self.seq_num, outcome.reason)
        except Exception as exc:
            partition.release_slot()
            await self._fail(exc)
            return
        self.execute()

    async def _fail(self, exc: Exception) -> None:
        self._release_locks()  # (admitted, or handed a lock, then never sent)
        self.submitter.stats.errors += 1
        await self.submitter.hook(self.context.on_exception, exc)
        self.submitter.ended()
        if not self.future.done():  # the application may have cancelled it
            self.future.set_exception(exc)
            if isinstance(exc, WaltzClosedError):  # the application closed the client: not an error to report
                self.future.exception()  # (asyncio's "Future exception was never retrieved"); awaiting it still raises

    def _set(self, result: bool) -> None:
        self._release_locks()  # (declined after being handed a lock)
        self.submitter.ended()
        if not self.future.done():
            self.future.set_result(result)

    def _spawn(self, coro: Any) -> None:
        self.submitter.tasks.spawn(coro, f"waltz-submit-{self.partition.partition_id}")
