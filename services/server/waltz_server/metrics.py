"""Prometheus metrics of a server: append outcomes, commit latency, per-partition gauges."""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from waltz_common import process_metrics
from waltz_common.port_guard import CallLimits, LimitMetrics
from waltz_server.cache_budget import CacheBudget
from waltz_server.store.api import StoreStatus

RESULTS = ("ok", "lock_failure", "rejected", "failed")


class BatchHistogram(Collector):
    """A histogram fed a batch of observations at a time (every append of a committed batch).

    prometheus_client's Histogram.observe takes a lock and two counter updates per observation, which
    cost more than the rest of an append's commit on the server; here a batch costs one lock. Exposed as
    an ordinary histogram (cumulative buckets, +Inf, _count, _sum).
    """

    def __init__(self, name: str, documentation: str, bounds: Iterable[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()  # the metrics HTTP server collects from its own thread

    def observe_many(self, values: Sequence[float]) -> None:
        bounds, place = self._bounds, bisect_left
        found = [place(bounds, v) for v in values]
        total = sum(values)
        with self._lock:
            counts = self._counts
            for i in found:
                counts[i] += 1
            self._sum += total

    def observe_counted(self, values: Sequence[tuple[float, int]]) -> None:
        """Observe each value count times (the appends of a batch that arrived together)."""
        bounds, place = self._bounds, bisect_left
        found = [(place(bounds, v), n) for v, n in values]
        total = sum(v * n for v, n in values)
        with self._lock:
            counts = self._counts
            for i, n in found:
                counts[i] += n
            self._sum += total

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)


class StoreCounters(Collector):
    """waltz_server_store_backlog_waits_total{partition}: each owned partition's StoreStatus.backlog_waits, read at
    each scrape (the store counts; the append path does not touch a metric for it)."""

    def __init__(self) -> None:
        self.statuses: dict[str, Callable[[], StoreStatus]] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "waltz_server_store_backlog_waits",
            "Store batches that waited because a replica had storage.maxReplicaBacklogBytes sent and not acknowledged: "
            "a replica that far behind the quorum holds the partition back",
            labels=["partition"],
        )
        for partition, status in sorted(self.statuses.items()):
            family.add_metric([partition], _status_field(status, "backlog_waits"))
        yield family


class ServerMetrics:
    """The server's metric families, registered in one registry (one per server: tests run several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        process_metrics.register(r, "server")
        self.append_requests = Counter(
            "waltz_server_append_requests", "Append requests by outcome", ["partition", "result"], registry=r
        )
        self.commit_latency = BatchHistogram(
            "waltz_server_commit_latency_seconds",
            "Time from an append's arrival to its commit at quorum",
            (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
        )
        r.register(self.commit_latency)
        self.store_batch_size = Histogram(
            "waltz_server_store_batch_appends",
            "Appends per store batch (one storage request to each replica)",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=r,
        )
        self.high_water_mark = Gauge(
            "waltz_server_partition_high_water_mark", "Highest committed transaction id", ["partition"], registry=r
        )
        self.session_id = Gauge(
            "waltz_server_partition_session_id", "Current store session id", ["partition"], registry=r
        )
        self.generation = Gauge("waltz_server_partition_generation", "Partition generation", ["partition"], registry=r)
        self.feed_lag = Gauge(
            "waltz_server_feed_lag_transactions",
            "Transactions the furthest-behind feed of the partition has committed that its client has not read yet "
            "(not sent, or waiting in the stream's outbound queue)",
            ["partition"],
            registry=r,
        )
        self.append_queue_size = Gauge(
            "waltz_server_append_queue_size", "Appends queued and not yet resolved", ["partition"], registry=r
        )
        self.partitions = Gauge("waltz_server_partitions", "Partitions owned by this server", registry=r)
        self.store_counters = StoreCounters()
        r.register(self.store_counters)
        self.replicas = Gauge(
            "waltz_server_partition_replicas",
            "The partition's storage replicas by state: assigned, connected, and in the write set (holding "
            "every committed transaction and taking appends). Fewer in the write set than assigned: the "
            "partition runs with a replica out (down, hung, failing writes, or catching up)",
            ["partition", "state"],
            registry=r,
        )

    def watch_cache_budget(self, budget: CacheBudget) -> None:
        """waltz_server_cache_budget_bytes and waltz_server_cache_bytes{cache=feed|data}, read at each scrape."""
        limit = Gauge("waltz_server_cache_budget_bytes", "server.cacheBudgetBytes: the caches' memory budget",
                      registry=self.registry)
        limit.set(budget.max_bytes)
        used = Gauge("waltz_server_cache_bytes", "Memory the caches of all owned partitions hold (estimated), by "
                     "cache: feed (recent feed entries) and data (transaction data)", ["cache"], registry=self.registry)
        for kind in ("feed", "data"):
            used.labels(kind).set_function(partial(_kind_use, budget, kind))

    def watch_client_port(self, limits: CallLimits) -> None:
        """waltz_server_client_streams, _connections, _streams_refused_total{reason} and
        _requests_undecodable_total of the client port, read at each scrape."""
        self.registry.register(LimitMetrics("waltz_server_client", {"client": limits}))

    def watch_zookeeper(self, state: Callable[[], str]) -> None:
        """waltz_server_zookeeper_session{state}: 1 for the state the session is in (state(): kazoo's
        CONNECTED, SUSPENDED or LOST), 0 for the others, read at each scrape."""
        gauge = Gauge(
            "waltz_server_zookeeper_session",
            "The ZooKeeper session's state, 1 for the current one: connected; suspended (the connection is lost, "
            "the session may still resume; owned partitions go on serving, ownership changes wait); lost (the "
            "session expired: owned partitions go on serving until fenced or reassigned; the server registers "
            "anew once connected)",
            ["state"],
            registry=self.registry,
        )
        for name in ZOOKEEPER_STATES:
            gauge.labels(name).set_function(partial(_is_state, state, name))

    def for_partition(self, partition_id: int) -> PartitionMetrics:
        return PartitionMetrics(self, partition_id)


REPLICA_STATES = {"assigned": "replicas_total", "connected": "replicas_connected", "write_set": "replicas_in_write_set"}
"""The states of waltz_server_partition_replicas and the StoreStatus field each is read from when scraped."""

log = logging.getLogger(__name__)

ZOOKEEPER_STATES = ("connected", "suspended", "lost")


def _is_state(state: Callable[[], str], name: str) -> float:
    return 1.0 if state().lower() == name else 0.0


def _kind_use(budget: CacheBudget, kind: str) -> float:
    return float(budget.use_by_kind().get(kind, 0))


def _status_field(status: Callable[[], StoreStatus], name: str) -> float:
    try:
        return float(getattr(status(), name))
    except Exception:  # a scrape must not fail for one partition's store
        log.exception("reading the store status for the metrics failed")
        return float("nan")


class PartitionMetrics:
    """The label-bound children of one partition, so the hot path does no label lookups."""

    def __init__(self, metrics: ServerMetrics, partition_id: int) -> None:
        self._metrics = metrics
        self._label = str(partition_id)
        m, p = metrics, self._label
        self.appends = {result: m.append_requests.labels(p, result) for result in RESULTS}
        self.commit_latency = m.commit_latency
        self.store_batch_size = m.store_batch_size
        self.high_water_mark = m.high_water_mark.labels(p)
        self.session_id = m.session_id.labels(p)
        self.generation = m.generation.labels(p)
        self.feed_lag = m.feed_lag.labels(p)
        self.append_queue_size = m.append_queue_size.labels(p)
        self.replicas = {state: m.replicas.labels(p, state) for state in REPLICA_STATES}

    def watch_store(self, status: Callable[[], StoreStatus]) -> None:
        """Read the store session id and the replica counts from status() at each scrape: they change between
        commits too, and the commit path does not pay for them."""
        self.session_id.set_function(partial(_status_field, status, "session_id"))
        for state, child in self.replicas.items():
            child.set_function(partial(_status_field, status, REPLICA_STATES[state]))
        self._metrics.store_counters.statuses[self._label] = status

    def watch_appends(self, high_water_mark: Callable[[], int], queued: Callable[[], int]) -> None:
        """Read the high-water mark and the append queue's size at each scrape: they change with every append and
        commit, and the append path does not pay for them."""
        self.high_water_mark.set_function(high_water_mark)
        self.append_queue_size.set_function(queued)

    def watch_feed_lag(self, lag: Callable[[], int]) -> None:
        """Read the feed lag from lag() at each scrape: a client reading slowly changes it between commits."""
        self.feed_lag.set_function(lag)

    def remove(self) -> None:
        """Forget the partition's gauges (it moved to another server)."""
        m, p = self._metrics, self._label
        m.store_counters.statuses.pop(p, None)
        for gauge in (m.high_water_mark, m.session_id, m.generation, m.feed_lag, m.append_queue_size):
            try:
                gauge.remove(p)
            except KeyError:
                pass
        for state in REPLICA_STATES:
            try:
                m.replicas.remove(p, state)
            except KeyError:
                pass
