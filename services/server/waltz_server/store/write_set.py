"""The write set of a store session: its members, the batches sent to them, and the acknowledgements
that commit a batch once a majority of all the partition's replicas have it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from waltz.v1 import storage_pb2
from waltz_server.store.connection import Answer, StorageError, StorageTimeout
from waltz_server.store.events import Signal
from waltz_server.store.replica_session import ReplicaSession

MAX_OUTSTANDING_BATCHES = 1024
"""Batches queued for one replica beyond which appends wait, whatever their bytes (storage.maxReplicaBacklogBytes
bounds those): a bound on the bookkeeping. Not 8, as it was: a replica a round trip behind the quorum (far away, or
its fsync a moment slower) has that many small batches out all the time when appends come one by one, and the
partition then committed at most 8 batches per round trip of its slowest replica."""


@dataclass(eq=False)
class Batch:
    first: int
    last: int
    request: storage_pb2.StorageRequest
    serialized: bytes  # the request with seq_num 0, serialized once for every member
    done: asyncio.Future[int]  # the first id, once a majority of all replicas fsynced the batch
    votes: int = 0
    committed_at: float | None = None  # time.monotonic() when the quorum was reached


class Member:
    """A replica in the write set: it holds every committed transaction and gets every new batch.

    Its answers are counted as they come, in the order the batches were sent, by a callback on each answer (no
    task wakes per batch); serve() only waits for the first answer that is not an acknowledgement, or for one that
    does not come within storage.requestTimeoutSeconds of its turn (a timer checks, about once per timeout)."""

    def __init__(self, session: ReplicaSession, acked: int, on_ack: Callable[[Batch], None]) -> None:
        self.session = session
        self.acked = acked
        self.backlog_bytes = 0  # of the batches sent to it and not acknowledged
        self.failed = False  # serve() ended: the session is ending, nothing more goes to this member
        self.error: BaseException | None = None  # why it ends (serve() raises it)
        self._on_ack = on_ack
        self._loop = asyncio.get_running_loop()
        self._sent: deque[tuple[Batch, Answer]] = deque()  # unacknowledged, their answers called back as they come
        self._head_since = 0.0  # loop time since the oldest of them is the one awaited
        self._timer: asyncio.TimerHandle | None = None
        self._failure: asyncio.Future[None] | None = None  # serve() waits on it

    @property
    def outstanding(self) -> int:
        """Batches sent to it and not acknowledged."""
        return len(self._sent)

    @property
    def waiting(self) -> Batch | None:
        """The oldest batch sent to it and not acknowledged."""
        return self._sent[0][0] if self._sent else None

    def send(self, batch: Batch) -> None:
        if self.failed:
            return
        answer = Answer(self._answered)
        if not self._sent:
            self._head_since = self._loop.time()
        self._sent.append((batch, answer))
        self.backlog_bytes += len(batch.serialized)
        if self._timer is None:
            self._timer = self._loop.call_at(self._head_since + self.session.request_timeout_s, self._check_time)
        try:
            self.session.send_append(batch.request, batch.serialized, answer)
        except StorageError as exc:  # the member's stream is gone: the answer's callback fails it
            answer.set_exception(exc)

    def _answered(self, _: Answer) -> None:
        sent = self._sent
        counted = False
        while sent and sent[0][1].done() and self.error is None and not self.failed:
            batch, answer = sent[0]
            try:
                self.session.check_acknowledged(answer)
            except Exception as exc:  # serve() raises it, as it raised the answer it awaited
                self._fail(exc)
                return
            sent.popleft()
            self.backlog_bytes -= len(batch.serialized)
            self.acked = batch.last
            counted = True
            self._on_ack(batch)
        if counted and sent:
            self._head_since = self._loop.time()

    def _check_time(self) -> None:
        self._timer = None
        if not self._sent or self.failed or self.error is not None:
            return
        limit = self.session.request_timeout_s
        deadline = self._head_since + limit
        if self._sent[0][1].done():  # answered just now: its callback counts it and starts the next one's turn
            deadline = self._loop.time() + limit
        elif self._loop.time() >= deadline:
            self._sent[0][1].cancel()  # its late answer is dropped
            self._fail(StorageTimeout(f"{self.session.replica}: no answer within {limit:g} s"))
            return
        self._timer = self._loop.call_at(deadline, self._check_time)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(None)

    async def serve(self) -> None:
        """Wait until the member fails, and raise why; then nothing more is counted or sent to it."""
        try:
            if self.error is None:
                self._failure = self._loop.create_future()
                await self._failure
            assert self.error is not None
            raise self.error
        finally:
            self.failed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            for _, answer in self._sent:  # answers nobody will wait for: no "exception never retrieved"
                if not answer.done():
                    answer.cancel()
                elif not answer.cancelled():
                    answer.exception()


class WriteSet:
    """Members, batches in flight (oldest first) and the high-water mark they commit to.

    Every member gets every batch in order and acknowledges them in order, so batches reach the quorum
    in order: the high-water mark only moves forward, batch by batch. ``progress`` is notified on every
    acknowledgement.
    """

    def __init__(self, quorum: int, progress: Signal, max_backlog_bytes: int = 32 * 1024 * 1024) -> None:
        self.quorum = quorum
        self.max_backlog_bytes = max_backlog_bytes
        self._progress = progress
        self.members: dict[str, Member] = {}
        self.inflight: deque[Batch] = deque()
        self.high_water_mark = -1
        self.next_id = 0  # the first id of the next batch
        self._reaching: list[tuple[int, asyncio.Future[None]]] = []  # (id, done once the mark is at it)

    def open(self, high_water_mark: int) -> None:
        self.high_water_mark = high_water_mark
        self.next_id = high_water_mark + 1

    def join(self, replica: str, session: ReplicaSession, acked: int) -> None:
        self.members[replica] = Member(session, acked, self._acknowledged)

    def reaching(self, transaction_id: int) -> asyncio.Future[None]:
        """Done once the high-water mark is at transaction_id or past it: set by the commit that moves it there,
        so a waiter for a far mark (the checkpoint) does not wake on every acknowledgement."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.high_water_mark >= transaction_id:
            future.set_result(None)
        else:
            self._reaching.append((transaction_id, future))
        return future

    def has_room(self) -> bool:
        """Every member can take another batch: fewer than MAX_OUTSTANDING_BATCHES out, and under the byte bound
        (or nothing out, so that a batch larger than the bound still goes)."""
        limit = self.max_backlog_bytes
        return all(
            not m.outstanding or (m.outstanding < MAX_OUTSTANDING_BATCHES and m.backlog_bytes < limit)
            for m in self.members.values()
        )

    def laggards(self, now: float, lag: float) -> list[str]:
        """Members that have not acknowledged a batch which a quorum acknowledged more than lag seconds before
        now (time.monotonic()): alive as far as their streams tell, but not keeping up."""
        return [
            name
            for name, member in self.members.items()
            if member.waiting is not None
            and member.waiting.committed_at is not None
            and now - member.waiting.committed_at > lag
        ]

    def drained(self) -> bool:
        """Every member acknowledged every batch sent to it."""
        return all(m.outstanding == 0 for m in self.members.values())

    def send(self, count: int, request_for: Callable[[int], storage_pb2.StorageRequest]) -> asyncio.Future[int]:
        """Queue a batch of count records for every member; request_for(first id) builds its request."""
        first = self.next_id
        request = request_for(first)
        done = asyncio.get_running_loop().create_future()
        batch = Batch(first, first + count - 1, request, request.SerializeToString(), done)
        self.next_id = batch.last + 1
        self.inflight.append(batch)
        for member in self.members.values():
            member.send(batch)  # queued on the member's stream now, in batch order
        return batch.done

    def fail_all(self, error_for: Callable[[Batch], BaseException]) -> None:
        inflight, self.inflight = self.inflight, deque()
        for batch in inflight:
            if not batch.done.done():
                batch.done.set_exception(error_for(batch))

    async def serve(self, member: Member) -> None:
        """Count the member's acknowledgements in order (several batches may be at the node at once), as its
        answers come. Returns only by raising (the member failed)."""
        await member.serve()

    def _acknowledged(self, batch: Batch) -> None:
        batch.votes += 1
        if batch.votes == self.quorum:
            self._committed(batch)
        self._progress.notify()

    def _committed(self, batch: Batch) -> None:
        if self.inflight and self.inflight[0] is batch:
            self.inflight.popleft()
        self.high_water_mark = max(self.high_water_mark, batch.last)
        batch.committed_at = time.monotonic()
        if self._reaching:
            still: list[tuple[int, asyncio.Future[None]]] = []
            for mark, future in self._reaching:
                if mark > self.high_water_mark:
                    still.append((mark, future))
                elif not future.done():
                    future.set_result(None)
            self._reaching = still
        if not batch.done.done():  # (a caller may have cancelled its wait: the batch commits all the same)
            batch.done.set_result(batch.first)
