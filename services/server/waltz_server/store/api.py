"""The contract between a server partition and its replicated store (StorePartition)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from waltz.v1 import common_pb2
from waltz_common.types import Record

if TYPE_CHECKING:  # record_runs encodes with store.wire, which imports this module
    from waltz_server.record_runs import Run


class PendingRecord(Protocol):
    """A transaction to append: everything of a Record except the id the store assigns. The client's
    AppendRequest is one as it is (no per-append copy on the server's hot path)."""

    @property
    def req_id(self) -> common_pb2.ReqId: ...

    @property
    def header(self) -> int: ...

    @property
    def data(self) -> bytes: ...

    @property
    def data_length(self) -> int:
        """len(data), known without reading data (reading a protobuf bytes field copies it)."""
        ...

    @property
    def checksum(self) -> int: ...


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A PendingRecord made by hand (tools and tests)."""

    req_id: common_pb2.ReqId
    header: int
    data: bytes
    checksum: int

    @property
    def data_length(self) -> int:
        return len(self.data)


class AppendFailed(Exception):
    """The batch was not committed by this store session.

    ``committed_up_to`` is the partition high-water mark that the next session recovered when that
    is already known: records of the batch with an id at or below it did commit (their ids are
    ``first_transaction_id + i``); the rest did not and never will. When it is None the outcome
    is not known yet and the caller must wait for ``StorePartition.wait_ready`` and then compare
    ``first_transaction_id`` with ``high_water_mark``.
    """

    def __init__(self, message: str, first_transaction_id: int, committed_up_to: int | None = None) -> None:
        super().__init__(message)
        self.first_transaction_id = first_transaction_id
        self.committed_up_to = committed_up_to


class StoreUnavailable(Exception):
    """No store session is open (recovering, no quorum, closed): retry later or elsewhere."""


@dataclass(frozen=True, slots=True)
class StoreStatus:
    session_id: int
    high_water_mark: int
    healthy: bool
    detail: str
    replicas_connected: int
    replicas_total: int
    replicas_in_write_set: int = 0
    """Replicas holding every committed transaction and taking every append (0 between sessions)."""
    write_set: tuple[str, ...] = ()
    """Those replicas' storage node connect strings."""
    backlog_waits: int = 0
    """Store batches that waited because a replica had storage.maxReplicaBacklogBytes unacknowledged (ever, on this
    server): a replica that far behind the quorum holds the partition back."""


class StorePartition(Protocol):
    """One partition's durable, quorum-replicated log as seen by its owning server.

    Lifecycle: ``await start(generation)`` opens a store session in the background (new session id
    by compare-and-set in ZooKeeper, replica sessions, recovery); ``wait_ready()`` returns once a
    session is open and recovered. Any replica failure closes the session and a new one opens
    (with recovery) by itself; appends fail or succeed as that recovery decides. ``close()`` stops
    everything. Appends are pipelined with ``begin_append``: batches get their ids in the order they
    were begun and commit in that order; the caller batches.
    """

    partition_id: int
    on_fenced: Callable[[str], None] | None
    """Called (with the reason) when a newer owner fenced this store: see ReplicatedStorePartition.on_fenced."""

    @property
    def high_water_mark(self) -> int:
        """The highest committed transaction id (-1: empty). Only ever grows while open."""
        ...

    async def start(self, generation: int) -> None: ...

    async def set_generation(self, generation: int) -> None:
        """The partition's generation went up (ownership changed hands and came back)."""
        ...

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Return once a recovered session accepts appends; StoreUnavailable on timeout or close."""
        ...

    async def begin_append(self, records: Sequence[PendingRecord]) -> asyncio.Future[int]:
        """Send a batch behind the batches begun before it; the future gives its first transaction id (ids
        are dense, following the earlier batches') once a majority of the replicas fsynced it.

        Call it from one task at a time (a call may wait while replicas are behind: back-pressure).
        Raises StoreUnavailable, with nothing sent, when no session takes appends now. The future fails
        with AppendFailed when the session ends first; every batch begun after it in that session fails
        too, and none of them is resolved before the failed one.
        """
        ...

    def append_now(self, records: Sequence[PendingRecord]) -> asyncio.Future[int] | None:
        """begin_append when the batch can be sent without waiting (a session takes appends, its replicas have
        room, no begin_append is under way); None, with nothing sent, when it cannot (then use begin_append)."""
        ...

    async def append(self, records: Sequence[PendingRecord]) -> int:
        """Append a batch at quorum and wait for it; returns the first assigned transaction id (ids are dense).

        Raises AppendFailed when the session broke during the append, StoreUnavailable when no
        session is open. Never returns before a majority of the replicas fsynced the batch.
        """
        ...

    async def get_record(self, transaction_id: int) -> Record | None:
        """A committed record (None above the high-water mark)."""
        ...

    async def get_records(self, transaction_id: int, max_records: int) -> Sequence[common_pb2.Record]:
        """Consecutive committed records from transaction_id (fewer at the high-water mark), as the storage's
        Record messages: bulk readers pass them on without converting each one."""
        ...

    async def get_run(self, transaction_id: int, max_records: int) -> Run:
        """get_records' records as one run, as the storage nodes' data files hold them (a raw read): passed on
        without decoding any."""
        ...

    async def get_headers(self, transaction_id: int, max_records: int) -> Sequence[common_pb2.RecordHeader]:
        """Consecutive committed record headers from transaction_id, as the storage's RecordHeader messages: a
        far-behind feed copies them into its messages without converting each one."""
        ...

    def status(self) -> StoreStatus: ...

    async def close(self) -> None: ...
