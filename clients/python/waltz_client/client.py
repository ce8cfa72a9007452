"""AsyncWaltzClient: the asyncio Waltz client (submit, flush, high-water marks, lazy data)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from waltz.v1 import server_pb2
from waltz_client import fork_guard, metrics
from waltz_client.api import TransactionContext, WaltzClientCallbacks
from waltz_client.config import ClientConfig
from waltz_client.connection import ConnectionManager, ServerConnection
from waltz_client.driver import Driver, Ownership, Topology
from waltz_client.errors import (
    ForkedClientError,
    WaltzClosedError,
    WaltzError,
    WaltzTimeoutError,
)
from waltz_client.metrics import COUNTERS, LatencyHistogram, PartitionView
from waltz_client.partition import ClientPartition
from waltz_client.partition_env import PartitionEnv, Stats
from waltz_client.reads import ClientReads
from waltz_client.submission import Submitter
from waltz_client.tasks import TaskSet, callback_runner
from waltz_common.config import Config

log = logging.getLogger(__name__)
ConfigSource = Config | Mapping[str, Any] | str | Path | None


class AsyncWaltzClient(ClientReads):
    """The Waltz client for asyncio code; use `async with AsyncWaltzClient(...) as client:`.

    driver: None for a real cluster (gRPC + ZooKeeper from config), or a MockServer (or any
    Driver) for tests. Application callbacks and context hooks run on one dedicated thread, or
    (client.callbackThread: false) on the event loop, where they must never block.

    config: a YAML file's path, a mapping of (dotted or nested) keys, or None (WALTZ_* variables and defaults);
    overrides: keys that win over config's (`AsyncWaltzClient(callbacks, "client.yaml", overrides={...})`).

    metrics_registry: a prometheus_client CollectorRegistry to expose this client's metrics in (waltz_client_*,
    docs/applications.md), from construction until close(); None (the default): no metrics, and no cost.
    One client per registry (the names carry no client id): give each client of a process its own. In
    prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR set) they are written as its values every
    second instead, for a MultiProcessCollector (docs/client-guide.md, Metrics under multi-process servers).

    One process: a client made before a fork serves only the process that made it; in a forked child, using it
    raises ForkedClientError (make one per worker after the fork: docs/web-services.md), and closing it there only
    marks it closed, leaving the parent's connections alone.
    """

    def __init__(self, callbacks: WaltzClientCallbacks, config: ConfigSource = None, *, driver: Any = None,
                 metrics_registry: CollectorRegistry | None = None, overrides: Mapping[str, Any] | None = None) -> None:
        self._own_grpc = driver is None  # the client makes its gRPC driver (not a test's or a mock's)
        if self._own_grpc:
            fork_guard.check_new_grpc_client()
        self.config = ClientConfig.of(config, zookeeper_required=driver is None, overrides=overrides)
        self.callbacks = callbacks
        self._driver: Driver = _make_driver(driver, self.config)
        self._callback_thread = callback_runner(self.config.callback_thread, "waltz-callbacks")
        self._tasks = TaskSet()
        self._submissions = TaskSet()
        self._partitions: dict[int, ClientPartition] = {}
        self._topology: dict[int, Ownership] = {}
        self._topology_event = asyncio.Event()
        self._closed = False
        self._closing = False  # close() is flushing
        self._started = False
        self._usable = False  # started and not closed: the one flag submit() reads
        self.stats = Stats()
        self._submitter = Submitter(self._callback_thread, self._submissions, self.stats, self.config.max_retries)
        self.client_id = -1
        self._num_partitions = 0
        self.cluster_name = ""
        self._pid = os.getpid()
        self._forked_from: int | None = None  # the process that made it, once this one is a forked child
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._latency: LatencyHistogram | None = None
        self._lock_failure_latency: LatencyHistogram | None = None
        self._metrics: metrics.ClientMetrics | None = None
        if metrics_registry is not None:
            self._latency = LatencyHistogram()
            self._lock_failure_latency = LatencyHistogram()
            # ValueError if the registry already has a client's metrics
            self._metrics = metrics.register(self, metrics_registry, self._latency, self._lock_failure_latency)
        fork_guard.track(self)

    @property
    def num_partitions(self) -> int:
        """The cluster's number of partitions (what TransactionContext.partition_id is given), known once the client
        has started; 0 before."""
        return self._num_partitions

    async def __aenter__(self) -> AsyncWaltzClient:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # leaving on a cancellation or an interrupt: no waiting for the transactions in flight
        await self.close(flush=exc_type is None or issubclass(exc_type, Exception))

    async def start(self) -> None:
        """Connect, take a client id and (with client.autoMount) mount every partition."""
        self._check_process()
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.current_thread()
        if self._own_grpc:
            fork_guard.grpc_used()
        self._submitter.bind(self._loop)
        self._callback_thread.bind(self._loop)
        try:
            info = await self._driver.start(self._on_topology)
        except BaseException:
            self._closed = True
            self._unregister_metrics()
            await self._driver.close()
            self._callback_thread.shutdown()
            raise
        self.client_id, self._num_partitions, self.cluster_name = info.client_id, info.num_partitions, info.cluster_name
        self._connections = ConnectionManager(self._driver, self._dispatch, self._tasks, self.config.max_batch_size)
        self._env = PartitionEnv(
            client_id=self.client_id, config=self.config, callbacks=self.callbacks, call=self._callback_thread.call,
            call_first=self._callback_thread.call_first, post=self._callback_thread.post,
            post_first=self._callback_thread.post_first,
            lock_failure_latency=self._lock_failure_latency,
            connections=self._connections, ownership=self._topology.get, topology_changed=lambda: self._topology_event,
            fetch=self._fetch_blocking, fetch_range=self._fetch_range_blocking, read_range=self.transaction_range,
            stats=self.stats, latency=self._latency,
            refresh_topology=self._driver.refresh, high_water_mark=self._server_high_water_mark, loop=self._loop,
        )
        self._usable = not self._closed
        if self.config.auto_mount:
            self.mount_partitions(range(self.num_partitions))
        self._tasks.spawn(self._nudge_loop(), "waltz-flush-nudge")

    def mount_partitions(self, partition_ids: Iterable[int]) -> None:
        """Start mounting these partitions (all of them are mounted at start with client.autoMount)."""
        self._check_open()
        for pid in partition_ids:
            self._check_partition(pid)
            if pid not in self._partitions:
                partition = ClientPartition(pid, self._env)
                self._partitions[pid] = partition
                self._tasks.spawn(partition.run(), f"waltz-partition-{pid}")

    async def wait_mounted(self) -> None:
        """Wait until every partition this client uses is mounted (WaltzTimeoutError after
        client.mountTimeout; ClientAheadError or ClientIdDeniedError for a partition that cannot be)."""
        self._check_open()
        await asyncio.gather(*(p.wait_mounted() for p in self._partitions.values()))

    @property
    def partitions(self) -> list[int]:
        """The ids of the partitions this client mounts (every one with client.autoMount), sorted."""
        return sorted(self._partitions)

    async def submit(self, context: TransactionContext) -> asyncio.Future[bool]:
        """Queue a transaction: waits for a mounted partition and a free slot, then returns a future.

        The future ends True (committed and applied), False (execute declined), or with the
        exception on_exception got. Raises here when no slot frees in time (WaltzTimeoutError),
        the partition is unusable (ClientAheadError, ClientIdDeniedError) or the client is closed.
        """
        if not self._usable:
            self._check_open()
        pid = context.partition_id(self._num_partitions)
        partition = self._partitions.get(pid) if type(pid) is int else None  # mounted: pid is valid
        if partition is None:
            self._check_partition(pid)
            partition = self._partitions.get(pid)
            if partition is None:
                raise WaltzError(f"partition {pid} is not mounted (client.autoMount is false: call mount_partitions)")
        if not partition.try_acquire_slot():
            await partition.acquire_slot()
        return self._submitter.start(context, partition)

    async def submit_and_wait(self, context: TransactionContext, timeout: float | None = None) -> bool:
        """Submit and wait for the outcome, the common case in one call (instead of
        ``await (await client.submit(context))``): True once committed and applied, False when execute declined.

        Raises what submit raises, what the transaction ended with, or WaltzTimeoutError when timeout (seconds;
        None: no limit beyond the client's own) passes first: the transaction then still goes on, and the
        application's callbacks see its outcome as usual. Cancelling the task that awaits it (a client that hung up,
        a server's request timeout) likewise stops only the wait: once submit returned, the append may still commit
        and be applied (an unknown outcome: make the request idempotent, docs/web-services.md). Once it returned
        True, context.committed_transaction_id is the transaction's id (for wait_applied elsewhere).
        """
        future = await self.submit(context)
        if timeout is None:
            return await future
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done():
                raise
            future.add_done_callback(_retrieve)  # nobody awaits it now: its end must not be reported as unretrieved
            raise WaltzTimeoutError(f"the transaction did not end within {timeout:g} s; it goes on") from None

    def has_pending_transactions(self) -> bool:
        return self._submitter.pending > 0

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted transaction has ended (nudging servers with flushes)."""
        self._check_process()
        loop = asyncio.get_running_loop()
        timeout = self.config.request_timeout_s if timeout is None else timeout
        deadline = loop.time() + timeout
        while pending := self._submitter.pending:
            now = loop.time()
            if now >= deadline:
                raise WaltzTimeoutError(f"flush: {pending} transactions still pending after {timeout:g} s")
            for partition in self._partitions.values():
                partition.nudge(now, 0.0, 1.0)
            await self._submitter.wait_drained(min(1.0, deadline - now))

    def client_high_water_mark(self, partition_id: int) -> int:
        """What this client has applied of the partition (-1: nothing; also before mounting)."""
        self._check_process()
        partition = self._partitions.get(partition_id)
        return partition.client_high_water_mark if partition else -1

    async def wait_applied(self, partition_id: int, transaction_id: int, timeout: float | None = None) -> None:
        """Wait until this client has applied the partition up to transaction_id (its client high-water mark reached
        it): read-your-writes for a transaction another client committed (its context.committed_transaction_id,
        passed along with the request). This client's own submit_and_wait needs no such wait: its True comes once
        the transaction is applied here. Raises WaltzTimeoutError after timeout seconds (None: client.requestTimeout)
        and what stopped the partition (ClientAheadError, WaltzClosedError, ...)."""
        self._check_open()
        self._check_partition(partition_id)
        partition = self._partitions.get(partition_id)
        if partition is None:
            raise WaltzError(f"partition {partition_id} is not mounted (client.autoMount is false: call "
                             "mount_partitions)")
        if partition.client_high_water_mark >= transaction_id:
            return
        timeout = self.config.request_timeout_s if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                await partition.applied_waiters.wait(transaction_id)
        except TimeoutError:
            raise WaltzTimeoutError(
                f"partition {partition_id}: transaction {transaction_id} was not applied here within {timeout:g} s "
                f"(applied up to {partition.client_high_water_mark})") from None

    async def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Wait for the transactions in flight to end (flush: at most timeout seconds, None: client.closeTimeout),
        then fail what is still pending (WaltzClosedError), stop every task, release connections.

        A transaction that ends while closing ends as usual (committed, declined, failed); one failed by close()
        has its on_exception called and its future ended with WaltzClosedError, which asyncio does not report as
        never retrieved (the application closed the client; it may still await the future). flush=False (or
        client.closeTimeout 0) fails them at once.

        In a forked child of the process that made the client, it only marks the client closed: its connections,
        threads and loop are the parent's, which goes on using them."""
        if self._closed:
            return
        if self._forked_from is not None:
            self._closed = True
            return
        timeout = self.config.close_timeout_s if timeout is None else timeout
        if flush and timeout > 0 and self._started and not self._closing and self._submitter.pending:
            self._closing = True
            try:
                await self.flush(timeout)
            except WaltzTimeoutError as exc:
                log.warning("close: %s; failing them (WaltzClosedError)", exc)
            finally:
                self._closing = False
            if self._closed:  # closed meanwhile, by another task
                return
        self._closed = True
        self._usable = False
        fork_guard.untrack(self)
        self._unregister_metrics()
        if not self._started:
            self._callback_thread.shutdown()
            return
        error = WaltzClosedError("the client was closed")
        for partition in self._partitions.values():
            partition.shutdown(error)
        # every submission now ends by itself (on_exception first), in a task or from a callback
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        await self._submitter.wait_drained(self.config.request_timeout_s)
        await self._submissions.wait(max(0.0, deadline - asyncio.get_running_loop().time()))
        await self._submissions.cancel_all()
        await self._tasks.cancel_all()
        if hasattr(self, "_connections"):
            await self._connections.close()
        await self._driver.close()
        if self.config.callback_thread:
            await asyncio.to_thread(self._callback_thread.shutdown)  # a callback may need the loop
        else:
            self._callback_thread.shutdown()

    def metric_counters(self) -> dict[str, int]:
        """The client's counters by metric name (metrics.COUNTERS), for a scrape."""
        s = self.stats
        connections = getattr(self, "_connections", None)
        values = {
            "waltz_client_commits": s.committed, "waltz_client_applied_transactions": s.applied,
            "waltz_client_apply_batches": s.apply_batches,
            "waltz_client_declined_transactions": s.declined, "waltz_client_lock_failures": s.lock_failures,
            "waltz_client_retries": s.retries, "waltz_client_failed_appends": s.failed_appends,
            "waltz_client_failed_transactions": s.errors,
            "waltz_client_reconnects": connections.reconnects if connections is not None else 0,
        }
        assert values.keys() == COUNTERS.keys()
        return values

    def metric_callback_thread(self) -> tuple[int, float]:
        """The callback thread's queue length and busy seconds, for a scrape."""
        return self._callback_thread.queue_length(), self._callback_thread.busy_seconds

    def metric_partitions(self) -> list[PartitionView]:
        """What a scrape shows of each partition this client uses."""
        return [PartitionView(p.partition_id, p.mounted, p.client_high_water_mark, p.server_high_water_mark,
                              p.monitor.pending_count(), max(0, p.mounts - 1), p.catchup_remaining())
                for p in sorted(list(self._partitions.values()), key=lambda p: p.partition_id)]

    # ---- internals ------------------------------------------------------------------------

    def _unregister_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def _forked(self) -> None:
        """This process is a forked child of the one that made the client (os.register_at_fork)."""
        if self._forked_from is None:
            self._forked_from = self._pid
            self._usable = False

    def _check_process(self) -> None:
        if self._forked_from is not None:
            raise ForkedClientError(self._forked_from)

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise WaltzClosedError("the client is closed")
        if not self._started:
            raise WaltzError("the client is not started: use `async with` or await start()")

    def _check_partition(self, pid: int) -> None:
        if not isinstance(pid, int) or not 0 <= pid < self._num_partitions:
            raise ValueError(f"partition id {pid!r} is not in 0..{self.num_partitions - 1}")

    def _on_topology(self, topology: Topology) -> None:
        self._topology.clear()
        self._topology.update(topology)
        event, self._topology_event = self._topology_event, asyncio.Event()
        event.set()
        for partition in self._partitions.values():
            partition.recheck_owner()

    def _dispatch(self, conn: ServerConnection, pid: int,
                  message: server_pb2.ServerMessage | None) -> Awaitable[None] | None:
        """A message from conn to its partition, at once (None) unless the partition's inbox is full (what to await);
        message None: the stream ended, every partition on it is told."""
        if message is None:
            return self._stream_ended(conn)
        partition = self._partitions.get(pid)
        return partition.deliver(conn, message) if partition is not None else None

    async def _stream_ended(self, conn: ServerConnection) -> None:
        for each in list(self._partitions.values()):
            if each.conn is conn:
                waiting = each.deliver(conn, None)
                if waiting is not None:
                    await waiting

    async def _nudge_loop(self) -> None:
        threshold = self.config.long_wait_threshold_s
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.05, min(threshold / 4, 1.0)))
            now = loop.time()
            for partition in self._partitions.values():
                partition.nudge(now, threshold, threshold)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an ended future's exception retrieved (its outcome went to the context's hooks)."""
    if not future.cancelled():
        future.exception()


def _make_driver(driver: Any, config: ClientConfig) -> Driver:
    if driver is None and config.servers:
        from waltz_client.servers_driver import ServersDriver

        return ServersDriver(config)
    if driver is None:
        from waltz_client.grpc_driver import GrpcDriver, require_zookeeper

        require_zookeeper()
        return GrpcDriver(config)
    from waltz_client.mock import MockServer

    if isinstance(driver, MockServer):
        return driver.driver()
    if not isinstance(driver, Driver):
        raise TypeError(f"driver must be a MockServer or a Driver, not {type(driver).__name__}")
    return driver

