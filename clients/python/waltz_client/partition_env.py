"""What a partition shares with the rest of the client: its environment, the pending-append token, counters."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from waltz_client.api import TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_client.batch_data import FetchRange
from waltz_client.config import ClientConfig
from waltz_client.connection import ConnectionManager
from waltz_client.driver import Ownership
from waltz_client.metrics import LatencyHistogram
from waltz_client.monitor import Outcome, OutcomeKind
from waltz_common.types import ReqId


class PendingAppend:
    """A sent append as the monitor's token: its context and data, and settle(), which hears its final
    outcome (once per registration, on the event loop). A submission is one, registered again on a retry.

    It also holds the ReqId of the append sent last, as its four fields (no ReqId object is made per
    append): the monitor takes the token itself as the entry's ReqId."""

    __slots__ = (
        "client_id", "context", "data", "ended", "error", "generation", "partition_id", "sent", "sent_at", "seq_num"
    )
    client_id: int
    data: bytes
    generation: int
    partition_id: int
    sent: TransactionBuilder  # what was sent last: sent again as it is after a remount
    sent_at: float  # the loop's clock when it was sent last (for the append latency metric)
    seq_num: int

    def __init__(self, context: TransactionContext) -> None:
        self.context = context
        self.error: BaseException | None = None  # set when the failure must not be retried
        self.ended = False
        # data, client_id, generation, partition_id, sent_at, seq_num: set when an append is sent

    @property
    def req_id(self) -> ReqId:
        """The ReqId of the append sent last."""
        return ReqId(self.client_id, self.generation, self.partition_id, self.seq_num)

    def settle(self, outcome: Outcome) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        """Parked behind another append (OwnLocks), now resolved: execute again."""
        raise NotImplementedError

    def commit(self, transaction_id: int) -> None:
        """settle() with a COMMITTED outcome: the common path, which needs no Outcome. Must not raise."""
        self.settle(Outcome(OutcomeKind.COMMITTED, transaction_id))

    @classmethod
    def commit_all(cls, tokens: Sequence[PendingAppend], transaction_ids: Sequence[int]) -> None:
        """commit() for each token (all of this class, of one partition, ended just now) with its transaction id, in
        order; a class may do it in one pass (the feed settles a batch's own appends with one call). Must not raise."""
        for token, transaction_id in zip(tokens, transaction_ids, strict=True):
            token.commit(transaction_id)


@dataclass
class Stats:
    """Counters for people (the demo prints them); not used for decisions."""

    committed: int = 0
    declined: int = 0
    failed_appends: int = 0
    lock_failures: int = 0
    retries: int = 0
    errors: int = 0
    applied: int = 0
    apply_batches: int = 0  # apply_transactions calls (callbacks that override it)
    inline_data: int = 0  # other clients' transactions applied with the data the feed carried (no fetch)
    fetched: int = 0  # other clients' transactions whose data was fetched from the server


@dataclass
class PartitionEnv:
    """What a partition needs from its client."""

    client_id: int
    config: ClientConfig
    callbacks: WaltzClientCallbacks
    call: Callable[..., Awaitable[Any]]  # run application code on the callback thread
    call_first: Callable[..., Awaitable[Any]]  # the same, ahead of what waits there (applying the feed)
    post: Callable[..., None]  # run application code on the callback thread, not waiting for it
    connections: ConnectionManager
    ownership: Callable[[int], Ownership | None]
    topology_changed: Callable[[], asyncio.Event]
    fetch: Callable[[int, int], bytes]  # (partition id, transaction id) -> data, for Transaction.data()
    fetch_range: FetchRange | None = None  # (partition id, first, last) -> data by id: a batch's data at once
    read_range: Callable[[int, int, int], Awaitable[dict[int, bytes]]] | None = None  # fetch_range, on the loop
    stats: Stats = field(default_factory=Stats)
    latency: LatencyHistogram | None = None  # append latencies, when the application asked for metrics
    lock_failure_latency: LatencyHistogram | None = None  # from sending an append to its LockFailure arriving
    refresh_topology: Callable[[], None] = lambda: None  # a server said NOT_READY: ask where partitions are now
    high_water_mark: Callable[[str, int], Awaitable[int]] | None = None  # (endpoint, partition): a catch-up's target
    post_first: Callable[..., None] | None = None  # post, ahead of what waits there (a lock failure's hook); None: post
    progress_interval_s: float = 5.0  # seconds between a catch-up's progress lines (INFO)
    loop: asyncio.AbstractEventLoop | None = None  # the client's (None: the running one, asked each time: a getpid)
