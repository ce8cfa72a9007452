"""The write set of a store session: its members, the batches sent to them, and the acknowledgements
that commit a batch once a majority of all the partition's replicas have it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from waltz.v1 import storage_pb2
from waltz_server.store.connection import StorageError
from waltz_server.store.events import Signal
from waltz_server.store.replica_session import ReplicaSession

MAX_OUTSTANDING_BATCHES = 8
"""Batches queued for one replica beyond which appends wait (a slow replica holds the partition back)."""


@dataclass(eq=False)
class Batch:
    first: int
    last: int
    request: storage_pb2.StorageRequest
    serialized: bytes  # the request with seq_num 0, serialized once for every member
    done: asyncio.Future[int]  # the first id, once a majority of all replicas fsynced the batch
    votes: int = 0
    committed_at: float | None = None  # time.monotonic() when the quorum was reached


@dataclass(eq=False)
class Member:
    """A replica in the write set: it holds every committed transaction and gets every new batch."""

    session: ReplicaSession
    sent: asyncio.Queue[tuple[Batch, asyncio.Future[storage_pb2.StorageResponse]]]  # awaiting its answer
    acked: int
    outstanding: int = 0
    waiting: Batch | None = None  # the oldest batch sent to it and not acknowledged (serve() waits for it)
    failed: bool = False  # serve() ended: the session is ending, nothing more goes to this member

    def send(self, batch: Batch) -> None:
        if self.failed:
            return
        try:
            answer = self.session.send_append(batch.request, batch.serialized)
        except StorageError as exc:  # the member's stream is gone: serve() fails it when it gets here
            answer = asyncio.get_running_loop().create_future()
            answer.set_exception(exc)
        self.sent.put_nowait((batch, answer))
        self.outstanding += 1


class WriteSet:
    """Members, batches in flight (oldest first) and the high-water mark they commit to.

    Every member gets every batch in order and acknowledges them in order, so batches reach the quorum
    in order: the high-water mark only moves forward, batch by batch. ``progress`` is notified on every
    acknowledgement.
    """

    def __init__(self, quorum: int, progress: Signal) -> None:
        self.quorum = quorum
        self._progress = progress
        self.members: dict[str, Member] = {}
        self.inflight: deque[Batch] = deque()
        self.high_water_mark = -1
        self.next_id = 0  # the first id of the next batch

    def open(self, high_water_mark: int) -> None:
        self.high_water_mark = high_water_mark
        self.next_id = high_water_mark + 1

    def join(self, replica: str, session: ReplicaSession, acked: int) -> None:
        self.members[replica] = Member(session, asyncio.Queue(), acked)

    def has_room(self) -> bool:
        return all(m.outstanding < MAX_OUTSTANDING_BATCHES for m in self.members.values())

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
        """Count the member's acknowledgements in order (several batches may be at the node at once).
        Returns only by raising (the member failed)."""
        try:
            while True:
                batch, answer = await member.sent.get()
                member.waiting = batch
                await member.session.acknowledged(answer)
                member.waiting = None
                member.acked = batch.last
                member.outstanding -= 1
                batch.votes += 1
                if batch.votes == self.quorum:
                    self._committed(batch)
                self._progress.notify()
        finally:
            member.failed = True
            while not member.sent.empty():  # answers nobody will wait for: no "exception never retrieved"
                _, answer = member.sent.get_nowait()
                if not answer.done():
                    answer.cancel()
                elif not answer.cancelled():
                    answer.exception()

    def _committed(self, batch: Batch) -> None:
        if self.inflight and self.inflight[0] is batch:
            self.inflight.popleft()
        self.high_water_mark = max(self.high_water_mark, batch.last)
        batch.committed_at = time.monotonic()
        if not batch.done.done():  # (a caller may have cancelled its wait: the batch commits all the same)
            batch.done.set_result(batch.first)
