"""An in-memory StorePartition honouring store/api.py, with knobs to hold and fail appends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from waltz.v1 import common_pb2
from waltz_common.types import Record
from waltz_common.wire import header_to_proto
from waltz_server.identity import ClientIdentity
from waltz_server.record_runs import Run, run_from_records
from waltz_server.store.api import AppendFailed, PendingRecord, StoreStatus, StoreUnavailable
from waltz_server.validation import req_id_of
from waltz_storage.protocol import record_to_proto


@dataclass
class Failure:
    """The next append fails: `commit` records of it reach quorum; `known` says whether the store
    already knows that when it raises (committed_up_to set) or only after the next session."""

    commit: int = 0
    known: bool = True


class FakeStore:
    """One partition's log in memory. Batches begun together commit one after another, in order; a failure
    ends the "session", failing the batches begun after it too."""

    def __init__(self, partition_id: int, records: list[Record] | None = None) -> None:
        self.partition_id = partition_id
        self.records: list[Record] = list(records or [])
        self.session_id = -1
        self.generation: int | None = None
        self.gate = asyncio.Event()  # clear it to hold appends in flight
        self.gate.set()
        self.failures: list[Failure | None] = []  # outcome of the next appends in turn (None: success)
        self.unavailable_once = False
        self.batches: list[int] = []  # size of every append call
        self.header_reads: list[tuple[int, int]] = []
        self.record_reads = 0
        self._ready = asyncio.Event()
        self._closed = False
        self.ready_delay = 0.0
        self.most_in_flight = 0  # the most batches begun and not resolved at once
        self._in_flight = 0
        self._tail: asyncio.Future[None] | None = None
        self._next_session = -1
        self._next_id = 0
        self._failed_up_to: int | None = None
        self.on_fenced: Callable[[str], None] | None = None

    def fence(self, reason: str = "a replica refused the session: STALE_SESSION") -> None:
        """A newer owner's store session fenced this one: no more appends, and the owner is told."""
        self._ready.clear()
        self.session_id += 1  # batches in flight fail, their outcome known only to the new owner
        if self.on_fenced is not None:
            self.on_fenced(reason)

    @property
    def high_water_mark(self) -> int:
        return len(self.records) - 1

    @property
    def in_flight(self) -> int:
        """Batches begun and not resolved now."""
        return self._in_flight

    async def start(self, generation: int) -> None:
        self.generation = generation
        asyncio.get_running_loop().call_later(self.ready_delay, self._open_session)

    def _open_session(self) -> None:
        if not self._closed:
            self.session_id += 1
            self._ready.set()

    async def set_generation(self, generation: int) -> None:
        self.generation = generation

    async def wait_ready(self, timeout: float | None = None) -> None:
        if self._closed:
            raise StoreUnavailable("closed")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise StoreUnavailable("no session") from None
        if self._closed:
            raise StoreUnavailable("closed")

    async def begin_append(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        if self._closed or not self._ready.is_set():
            raise StoreUnavailable("no session")
        if self.unavailable_once:
            self.unavailable_once = False
            raise StoreUnavailable("session closed before the batch was sent")
        return self._begin(records)

    def append_now(self, records: Sequence[PendingRecord]) -> asyncio.Future[int] | None:
        if self._closed or not self._ready.is_set() or self.unavailable_once:
            return None  # begin_append says why
        return self._begin(records)

    def _begin(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        if self._next_session != self.session_id:  # a new session: it starts after what was recovered
            self._next_session, self._next_id = self.session_id, len(self.records)
        first, self._next_id = self._next_id, self._next_id + len(records)
        committed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self._in_flight)
        previous = self._tail
        self._tail = asyncio.ensure_future(self._commit(previous, self.session_id, first, records, committed))
        return committed

    async def _commit(
        self,
        previous: asyncio.Future[None] | None,
        session_id: int,
        first: int,
        records: Sequence[PendingRecord],
        committed: asyncio.Future[int],
    ) -> None:
        """Batches commit in the order they were begun, each once the gate is open."""
        if previous is not None:
            await previous
        try:
            await self.gate.wait()
            if session_id != self.session_id or self._closed:  # an earlier batch of its session failed
                committed.set_exception(AppendFailed("the session ended", first, self._failed_up_to))
                return
            self.batches.append(len(records))
            failure = self.failures.pop(0) if self.failures else None
            kept = records if failure is None else records[: failure.commit]
            for offset, r in enumerate(kept):
                self.records.append(Record(first + offset, req_id_of(r.req_id), r.header, r.data, r.checksum))
            if failure is None:
                committed.set_result(first)
                return
            self.session_id += 1
            if failure.known:
                self._failed_up_to = self.high_water_mark
            else:
                self._failed_up_to = None
                self._ready.clear()
                asyncio.get_running_loop().call_later(0.05, self._ready.set)
            committed.set_exception(AppendFailed("replica failed", first, self._failed_up_to))
        finally:
            self._in_flight -= 1

    async def append(self, records: Sequence[PendingRecord]) -> int:
        return await (await self.begin_append(records))

    async def get_record(self, transaction_id: int) -> Record | None:
        self.record_reads += 1
        if 0 <= transaction_id < len(self.records):
            return self.records[transaction_id]
        return None

    async def get_records(self, transaction_id: int, max_records: int) -> list[common_pb2.Record]:
        self.record_reads += 1
        return [record_to_proto(r) for r in self.records[transaction_id : transaction_id + max_records]]

    async def get_run(self, transaction_id: int, max_records: int) -> Run:
        return run_from_records(transaction_id, await self.get_records(transaction_id, max_records))

    async def get_headers(self, transaction_id: int, max_records: int) -> list[common_pb2.RecordHeader]:
        self.header_reads.append((transaction_id, max_records))
        return [header_to_proto(r.record_header) for r in self.records[transaction_id : transaction_id + max_records]]

    def status(self) -> StoreStatus:
        healthy = self._ready.is_set() and not self._closed
        detail = "ok" if healthy else "no session"
        return StoreStatus(self.session_id, self.high_water_mark, healthy, detail, 1, 1, 1 if healthy else 0)

    async def close(self) -> None:
        self._closed = True
        self._ready.set()  # wake waiters, who then see the store closed


class FakeStream:
    """A client stream as a partition sees it: records every message sent to the client."""

    _next_id = 0

    def __init__(self, room: int = 10_000) -> None:
        FakeStream._next_id += 1
        self.stream_id = FakeStream._next_id
        self.messages: list = []
        self.room = room
        self._changed = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()

    def send_control(self, message) -> None:
        self.messages.append(message)
        self._changed.set()

    async def send_feed(self, message) -> None:
        while len(self.messages) >= self.room:
            self.drained.clear()
            await self.drained.wait()
        self.messages.append(message)
        self._changed.set()

    def try_send_feed(self, message) -> bool:
        if len(self.messages) >= self.room:
            return False
        self.send_control(message)
        return True

    def written(self, partition_id: int) -> int | None:
        """What a client reading every message recorded here has read of the partition."""
        fed = [f.transaction_id for batch in self.of("feed") for f in batch.transactions
               if f.req_id.partition_id == partition_id]
        return fed[-1] if fed else None

    def of(self, kind: str) -> list:
        return [getattr(m, kind) for m in self.messages if m.WhichOneof("message") == kind]

    def fed(self) -> list[tuple[int, int]]:
        """(transaction id, seq_num of the originating append) of every fed transaction, in order."""
        return [(f.transaction_id, f.req_id.seq_num) for batch in self.of("feed") for f in batch.transactions]

    async def wait_for(self, predicate, timeout: float = 10.0) -> None:
        async def loop() -> None:
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)


class MemoryBindings:
    """Client id bindings in a dict (identity.BindingStore), counting the calls; fail makes every call raise."""

    def __init__(self, issued: int = 100) -> None:
        self.bindings: dict[int, ClientIdentity] = {}
        self.issued = issued
        self.calls = 0
        self.fail = False

    async def bound(self, client_id: int) -> ClientIdentity | None:
        self._call()
        return self.bindings.get(client_id)

    async def bind(self, client_id: int, identity: ClientIdentity) -> ClientIdentity:
        self._call()
        return self.bindings.setdefault(client_id, identity)

    async def issued_up_to(self) -> int:
        self._call()
        return self.issued

    def _call(self) -> None:
        self.calls += 1
        if self.fail:
            raise ConnectionError("ZooKeeper is gone")
