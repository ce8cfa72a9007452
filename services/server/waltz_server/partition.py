"""An owned partition: the append task over one StorePartition and its feeds (the admission of appends is in
partition_admission, the requests of mounted clients in partition_requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from waltz.v1 import server_pb2
from waltz_server.append_pipeline import AppendPipeline, ClientPending, Resolved
from waltz_server.cache_budget import CacheBudget
from waltz_server.caches import DataCache
from waltz_server.config import PartitionSettings
from waltz_server.feed import StreamPort
from waltz_server.locks import LockTable
from waltz_server.metrics import PartitionMetrics
from waltz_server.mounts import MountRegistry
from waltz_server.partition_admission import AdmittedAppend, AppendAdmission, Reason
from waltz_server.partition_feeds import PartitionFeeds, prepared_feed
from waltz_server.partition_requests import MountedRequests
from waltz_server.pending_batch import PendingBatch
from waltz_server.sequences import SequenceWindow
from waltz_server.store.api import StorePartition, StoreUnavailable
from waltz_server.store_batches import StoreBatches, wait_store_ready

log = logging.getLogger(__name__)


def _pending_records(batch: list[AdmittedAppend]) -> PendingBatch:
    return PendingBatch([item.request for item in batch], [item.record for item in batch])


class Partition(AppendAdmission, MountedRequests):
    """One partition this server owns, with its generation, over its replicated store."""

    def __init__(
        self,
        partition_id: int,
        generation: int,
        store: StorePartition,
        settings: PartitionSettings,
        metrics: PartitionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget: CacheBudget | None = None,
    ) -> None:
        """budget: the server's cache budget, shared by its partitions (None: only the settings' bounds)."""
        self.partition_id = partition_id
        self.generation = generation
        self.store = store
        self.settings = settings
        self.metrics = metrics
        if metrics is not None:
            metrics.watch_store(store.status)
            metrics.watch_feed_lag(self.feed_lag)
            metrics.watch_appends(lambda: self.feeds.high_water_mark, self.pending_appends)
            metrics.generation.set(generation)
        self._clock = clock
        self._ready = asyncio.Event()
        self._closed = False
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._pipeline: AppendPipeline[AdmittedAppend] | None = None
        self._batches: StoreBatches[AdmittedAppend] | None = None
        self._pending: ClientPending[Callable[[], None]] = ClientPending()
        self._mounts = MountRegistry()
        self._sequences = SequenceWindow(settings.resend_window)
        self.feeds = PartitionFeeds(
            partition_id, store, settings.feed_cache_size, settings.feed_batch_size, settings.feed_fetch_size, budget,
            settings.feed_inline_max_bytes,
        )
        self._prepared: deque[tuple[AdmittedAppend, server_pb2.ServerMessage]] = deque()
        """The feed message of each batch at the store, oldest first, with the batch's first append."""
        self.data_cache = DataCache(settings.data_cache_bytes, budget)
        self._runner: asyncio.Task[None] | None = None
        self.failure: str = ""
        self.on_failure: Callable[[Partition], None] | None = None
        """Told when the partition's task failed (a bug): the owner restarts the partition."""

    # lifecycle

    async def open(self) -> None:
        """Start the store session and the append task in the background."""
        started = asyncio.Event()
        self._runner = asyncio.create_task(self._run(started), name=f"partition-{self.partition_id}")
        await started.wait()

    async def _run(self, started: asyncio.Event) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self.feeds.open(group)
                started.set()
                group.create_task(self._append_task())
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: report it through health rather than dying silently
            self.failure = f"partition task failed: {exc!r}"
            log.exception("partition %d failed", self.partition_id)
            self._ready.clear()
            if self.on_failure is not None:
                self.on_failure(self)
        finally:
            started.set()

    async def close(self) -> None:
        """Stop: refuse queued appends (PARTITION_NOT_READY), end feeds, close the store session.

        Each feed ends with an unasked NOT_READY for the mount that started it, so that its client mounts
        again (wherever the partition is now) even when it only reads, and even when ZooKeeper shows it no
        change (the partition reopens here under the same generation: restarted after a failure, or taken
        back after this server's ZooKeeper session expired)."""
        if self._closed:
            return
        self._closed = True
        self._ready.clear()
        if self._batches is not None:
            self._batches.closed = True
        if self._pipeline is not None:
            message = f"partition {self.partition_id} was closed"
            for item in self._pipeline.drop(lambda _: True):
                self._reject(item.origin.stream, item.request.req_id, Reason.PARTITION_NOT_READY, message)
        self._pending.drop_waiters()
        self._room.set()
        self.feeds.close()
        self.data_cache.close()
        self._prepared.clear()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        try:
            await self.store.close()
        finally:
            if self.metrics is not None:
                self.metrics.remove()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def set_generation(self, generation: int) -> None:
        """The partition came back with a higher generation: refuse queued appends of the old one."""
        if generation == self.generation:
            return
        self.generation = generation
        if self.metrics is not None:
            self.metrics.generation.set(generation)
        await self.store.set_generation(generation)
        if self._pipeline is not None:
            stale = self._pipeline.drop(lambda item: item.generation != generation)
            for item in stale:
                self._resolve_unsent(item, Reason.WRONG_GENERATION, self._generation_message(generation))

    # reads used by feeds and unary calls

    @property
    def high_water_mark(self) -> int:
        return self.feeds.high_water_mark

    def pending_appends(self) -> int:
        return len(self._pipeline) if self._pipeline is not None else 0

    # client stream messages

    async def submit(
        self, stream: StreamPort, requests: Sequence[server_pb2.AppendRequest]
    ) -> list[server_pb2.AppendRequest]:
        """Queue this partition's appends among requests in order; waits while the append queue is full
        (back-pressure). Returns the others (of other partitions), in order: a client message's appends are read
        once, not first sorted by partition."""
        arrived = self._clock()
        others: list[server_pb2.AppendRequest] = []
        done, total = 0, len(requests)
        while done < total:
            if self._must_wait():
                await self._wait_for_room()
                arrived = self._clock()
            room = total - done  # as many as the queue takes now, without a check per append
            if self._pipeline is not None and not self._closed:
                room = min(room, max(1, self.settings.append_queue_size - len(self._pipeline)))
            self._submit_some(stream, requests[done : done + room] if room < total else requests, arrived, others)
            done += room
        if self._pipeline is not None:
            self._answer_lock_failures(self._pipeline.poll())
            if self._batches is not None:
                self._batches.offered()
            else:
                self._work.set()
        return others

    def _send(self) -> None:
        """The appends offered go to the store now when it takes them without waiting (else the append task does)."""
        if self._batches is not None:
            self._batches.pump()
        else:
            self._work.set()

    def _must_wait(self) -> bool:
        pipeline = self._pipeline
        if self._closed:
            return False
        return pipeline is not None and len(pipeline) >= self.settings.append_queue_size

    async def _wait_for_room(self) -> None:
        while not self._closed:
            if self._pipeline is not None and len(self._pipeline) >= self.settings.append_queue_size:
                self._answer_lock_failures(self._pipeline.poll())
                self._send()
                self._room.clear()
                await self._room.wait()
            else:
                return

    def feed_lag(self) -> int:
        return self.feeds.lag()

    # the append task

    async def _append_task(self) -> None:
        try:
            await self._serve_appends()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # close() cancelled the partition
            # A CancelledError nobody asked for (an awaited future was cancelled): the task group
            # would drop it without a word and the partition would look healthy but never append.
            raise RuntimeError("the append task got a CancelledError it was not asked for") from None

    async def _serve_appends(self) -> None:
        await self.store.start(self.generation)
        hwm = await self._read_tail()
        self.feeds.reset(hwm)
        s = self.settings
        pipeline: AppendPipeline[AdmittedAppend] = AppendPipeline(
            LockTable(hwm, s.lock_table_size), s.max_batch_size, s.max_batch_bytes, s.max_batches_in_flight
        )
        self._pipeline = pipeline
        self._ready.set()
        log.info("partition %d ready: generation %d, high-water mark %d", self.partition_id, self.generation, hwm)
        self._batches = StoreBatches(
            self.partition_id,
            self.store,
            pipeline,
            _pending_records,
            self._apply,
            self._prepare,
            self._answer_lock_failures,
            self._work,
            self.metrics.store_batch_size if self.metrics is not None else None,
        )
        await self._batches.run()

    async def _read_tail(self) -> int:
        """Wait for the store, then rebuild the re-send window from the log's last transactions (before any
        append is taken: a re-send of one of them must be recognised). Returns the high-water mark."""
        while True:
            await wait_store_ready(self.store)
            hwm = self.store.high_water_mark
            first = next_id = max(0, hwm - self._sequences.window + 1)
            tail: list[tuple[int, int, int]] = []
            try:
                while next_id <= hwm:
                    count = min(self.settings.feed_fetch_size, hwm - next_id + 1)
                    headers = await self.store.get_headers(next_id, count)
                    if not headers or headers[0].transaction_id != next_id:
                        raise StoreUnavailable(f"partition {self.partition_id}: no headers from {next_id} yet")
                    tail.extend((h.req_id.client_id, h.req_id.seq_num, h.transaction_id) for h in headers)
                    next_id = headers[-1].transaction_id + 1
            except StoreUnavailable as exc:
                log.info("partition %d: reading the log's tail from %d again: %s", self.partition_id, first, exc)
                await asyncio.sleep(0.2)
                continue
            self._sequences.rebuild(entry for entry in tail if entry[2] <= hwm)
            return hwm

    def _prepare(self, batch: list[AdmittedAppend]) -> None:
        """The batch is at the store: build its feed message now, while the replicas write it, numbered after
        the batch before it (as it commits unless a store session ends meanwhile)."""
        prepared = self._prepared
        first = self.feeds.high_water_mark + 1
        if prepared:
            previous = prepared[-1][1].feed.transactions
            first = previous[0].transaction_id + len(previous)
        prepared.append((batch[0], prepared_feed(first, self.partition_id, batch)))

    def _apply(self, resolved: Resolved[AdmittedAppend]) -> None:
        """Publish committed appends to the feeds at once; the rest (data cache, metrics, flushes waiting for
        them, queue room) follows on the next turn of the loop, after the stream writers sent the feed."""
        now = self._clock()
        committed, failed = resolved.committed, resolved.failed
        first_item = committed[0][0] if committed else failed[0] if failed else None
        message = None
        if self._prepared and self._prepared[0][0] is first_item:
            message = self._prepared.popleft()[1]
        if committed:
            if message is None or len(message.feed.transactions) != len(committed):  # part of a failed batch
                message = prepared_feed(committed[0][1], self.partition_id, [item for item, _ in committed])
            self.feeds.publish(committed[0][1], message, (item.request for item, _ in committed))
        asyncio.get_running_loop().call_soon(self._settle, resolved, now)

    def _settle(self, resolved: Resolved[AdmittedAppend], committed_at: float) -> None:
        """What a resolved batch releases besides its feed."""
        committed = resolved.committed
        if committed:
            # One pass over the batch: the data cache's entries, the re-send window, the commit latencies (the
            # appends of one client message arrived together: one observation per run of them).
            record = self._sequences.record
            entries: list[tuple[server_pb2.AppendRequest, int]] = []
            latencies: list[tuple[float, int]] = []
            message, run = committed[0][0].origin, 0
            for item, transaction_id in committed:
                entries.append((item.request, item.size))  # an AppendRequest has what a read needs
                record((item.client_id, item.seq_num, transaction_id))
                if item.origin is not message:
                    latencies.append((committed_at - message.arrived, run))
                    message, run = item.origin, 0
                run += 1
            latencies.append((committed_at - message.arrived, run))
            self.data_cache.put_many(committed[0][1], entries)
            if self.metrics is not None:
                self.metrics.commit_latency.observe_counted(latencies)
        self._sequences.forget_silent(self._pending.pending)
        if self.metrics is not None:
            m = self.metrics
            if committed:
                m.appends["ok"].inc(len(committed))
            if resolved.failed:
                m.appends["failed"].inc(len(resolved.failed))
        for waiter in self._pending.resolved_all(item for item, _ in committed):
            waiter()
        for waiter in self._pending.resolved_all(resolved.failed):
            waiter()
        self._room.set()

    def _resolved(self, item: AdmittedAppend) -> None:
        for waiter in self._pending.resolved(item.client_id, item.ticket):
            waiter()

    def _answer_lock_failures(self, failures: list[tuple[AdmittedAppend, int]]) -> None:
        for item, transaction_id in failures:
            failure = server_pb2.LockFailure(req_id=item.request.req_id, transaction_id=transaction_id)
            item.origin.stream.send_control(server_pb2.ServerMessage(lock_failure=failure))
            if self.metrics is not None:
                self.metrics.appends["lock_failure"].inc()
            self._resolved(item)
        if failures:
            self._room.set()

    def _resolve_unsent(self, item: AdmittedAppend, reason: Reason.ValueType, message: str) -> None:
        self._reject(item.origin.stream, item.request.req_id, reason, message)
        self._resolved(item)
