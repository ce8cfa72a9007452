"""Client metrics for Prometheus: a collector that reads the client's counters and partitions at scrape time, or,
under a multi-process server (prometheus_client's multiprocess mode: PROMETHEUS_MULTIPROC_DIR set), prometheus_client
values that a thread writes from the same readings every second, for a MultiProcessCollector to sum across workers.

Nothing here runs per append: LatencyHistogram.observe_counted (a bisect and two additions, no lock, no label lookup)
runs once per run of a feed message's own appends that were sent together, and the counters are the plain integers
the client keeps anyway (Stats), read when scraped (or written every second).
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# seconds: a commit on one machine takes about a millisecond; a remount or a lost append, seconds
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """Observations counted into fixed buckets (upper bounds, as Prometheus' `le`). Written by the client's
    event loop only, read by a scrape on another thread: a scrape may see a sum one observation ahead of
    the buckets, never buckets that are not cumulative."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Iterable[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_counted(self, value: float, count: int) -> None:
        """observe(value) count times, in one step (appends sent together and committed in one feed message)."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.total += value * count

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """(le, cumulative count) pairs ending with +Inf, and the sum."""
        counts, total = list(self.counts), self.total
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets, total


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What a scrape reads of one partition."""

    partition_id: int
    mounted: bool
    client_high_water_mark: int
    server_high_water_mark: int
    pending_appends: int
    remounts: int
    catchup_remaining: int = 0  # -1: not mounted, target not known yet


class ClientView(Protocol):
    """What the collector needs of a client (AsyncWaltzClient provides it)."""

    def metric_counters(self) -> dict[str, int]: ...

    def metric_partitions(self) -> list[PartitionView]: ...

    def metric_callback_thread(self) -> tuple[int, float]: ...


# name (without _total) -> help; the values come from ClientView.metric_counters() under the same keys
COUNTERS = {
    "waltz_client_commits": "this client's transactions that committed (seen in the feed)",
    "waltz_client_applied_transactions": "transactions of any client applied by this client's callbacks",
    "waltz_client_apply_batches": "apply_transactions calls (callbacks that apply batches): applied transactions "
                                  "per batch is the ratio of the two counters",
    "waltz_client_declined_transactions": "transactions whose execute() returned False",
    "waltz_client_lock_failures": "appends refused for a lock conflict (each is then retried)",
    "waltz_client_retries": "re-executions of a transaction after a failed append or a lock failure",
    "waltz_client_failed_appends": "appends that did not commit (lost, superseded, rejected, lock failure)",
    "waltz_client_failed_transactions": "transactions that ended with an exception (on_exception)",
    "waltz_client_reconnects": "streams to a server opened again after the previous one to it ended",
}


# name, help, value, how prometheus_client's multiprocess mode combines the workers' values (live*: a dead worker's
# go with it, mark_process_dead): the least caught-up worker's mark, the worst worker's lag, the sum of pending appends
Mode = Literal["livemin", "livemax", "livesum"]
PARTITION_GAUGES: list[tuple[str, str, Callable[[PartitionView], int], Mode]] = [
    ("waltz_client_partition_mounted", "1 when the partition is mounted (appends allowed), else 0",
     lambda p: 1 if p.mounted else 0, "livemin"),
    ("waltz_client_partition_client_high_water_mark",
     "the highest transaction id this client has applied (-1: none)", lambda p: p.client_high_water_mark, "livemin"),
    ("waltz_client_partition_server_high_water_mark",
     "the highest transaction id the client has heard its server committed (mount, feed, flush answers)",
     lambda p: p.server_high_water_mark, "livemax"),
    ("waltz_client_partition_lag_transactions",
     "committed transactions the client has not applied yet, received or not (the server's high-water mark, "
     "heard with every feed message and flush answer as it arrives, and asked every 2 s while the client's "
     "stream is backed up, minus the client's)",
     lambda p: max(0, p.server_high_water_mark - p.client_high_water_mark), "livemax"),
    ("waltz_client_partition_pending_appends", "appends sent and not resolved yet",
     lambda p: p.pending_appends, "livesum"),
    ("waltz_client_partition_catchup_remaining_transactions",
     "transactions still to apply before the partition's mount completes (a mount waits for the catch-up "
     "feed to be applied; the target is the server's high-water mark, asked as the mount is sent and every "
     "few seconds while mounting); 0 when mounted; -1 while not mounted and the target not known yet",
     lambda p: p.catchup_remaining, "livemax"),
]
REMOUNTS = ("waltz_client_remounts", "mounts of the partition after its first one (a lost stream, a new generation, "
            "a moved partition, a feed gap)")
APPEND_LATENCY = ("waltz_client_append_latency_seconds",
                  "from sending an append to its commit arriving in the feed (per attempt that committed)")
LOCK_FAILURE_LATENCY = ("waltz_client_lock_failure_latency_seconds",
                        "from sending an append to its lock failure arriving (per attempt that failed its lock check)")
QUEUE_LENGTH: tuple[str, str, Mode] = ("waltz_client_callback_queue_length",
                "jobs (feed applies, execute() calls, hooks) waiting for the callback thread or in the batch it runs: "
                "a queue that stays long is a thread that cannot keep up", "livemax")
BUSY_SECONDS = ("waltz_client_callback_busy_seconds",
                "time the callback thread spent running application code (its rate near 1: always busy)")


class ClientMetrics(Protocol):
    """A client's metrics in a registry, until close()."""

    def close(self) -> None: ...


def multiprocess_mode() -> bool:
    """Whether prometheus_client writes its values to files for a MultiProcessCollector (its own test)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def register(client: ClientView, registry: CollectorRegistry, latency: LatencyHistogram,
             lock_failure_latency: LatencyHistogram) -> ClientMetrics:
    """The client's metrics in registry: a collector read at scrape time, or, in prometheus_client's multiprocess
    mode, ProcessValues (a collector would show one worker's values, whichever the scrape reached).
    ValueError if the registry has a client's metrics already."""
    if multiprocess_mode():
        return ProcessValues(client, registry, latency, lock_failure_latency)
    collector = ClientCollector(client, latency, lock_failure_latency)
    registry.register(collector)
    return _Registered(registry, collector)


class _Registered:
    def __init__(self, registry: CollectorRegistry, collector: Collector) -> None:
        self._registry, self._collector = registry, collector

    def close(self) -> None:
        self._registry.unregister(self._collector)


class ClientCollector(Collector):
    """Exposes one client's metrics; register it in a CollectorRegistry (one client per registry)."""

    def __init__(self, client: ClientView, latency: LatencyHistogram,
                 lock_failure_latency: LatencyHistogram | None = None) -> None:
        self._client = client
        self._latency = latency
        self._lock_failure_latency = lock_failure_latency if lock_failure_latency is not None else LatencyHistogram()

    def collect(self) -> Iterator[Metric]:
        partitions = self._client.metric_partitions()
        yield from _per_partition(partitions, [(name, text, value) for name, text, value, _ in PARTITION_GAUGES])
        remounts = CounterMetricFamily(*REMOUNTS, labels=["partition"])
        for p in partitions:
            remounts.add_metric([str(p.partition_id)], p.remounts)
        yield remounts
        values = self._client.metric_counters()
        for name, text in COUNTERS.items():
            yield CounterMetricFamily(name, text, value=values[name])
        for (name, text), histogram in ((APPEND_LATENCY, self._latency),
                                        (LOCK_FAILURE_LATENCY, self._lock_failure_latency)):
            buckets, total = histogram.cumulative()
            yield HistogramMetricFamily(name, text, buckets=buckets, sum_value=total)
        queued, busy = self._client.metric_callback_thread()
        yield GaugeMetricFamily(*QUEUE_LENGTH[:2], value=queued)
        yield CounterMetricFamily(*BUSY_SECONDS, value=busy)

    def describe(self) -> Iterator[Metric]:
        return self.collect()


class ProcessValues:
    """The client's metrics as prometheus_client Counter, Gauge and Histogram values, for its multiprocess mode: a
    thread writes them from the client's readings every `interval` seconds (and once more at close), so a scrape
    of any worker, through a MultiProcessCollector, sums the workers' counters and combines their gauges as
    PARTITION_GAUGES says; a value is at most `interval` old. Counters are written as increments: a client made
    again in the same process goes on from the values the previous one left."""

    interval = 1.0

    def __init__(self, client: ClientView, registry: CollectorRegistry, latency: LatencyHistogram,
                 lock_failure_latency: LatencyHistogram) -> None:
        self._client = client
        self._registry = registry
        self._sources = ((latency, APPEND_LATENCY), (lock_failure_latency, LOCK_FAILURE_LATENCY))
        made: list[Collector] = []
        try:
            self._gauges = [(Gauge(name, text, ["partition"], registry=registry, multiprocess_mode=mode), value)
                            for name, text, value, mode in PARTITION_GAUGES]
            self._mounted = self._gauges[0][0]
            made += [g for g, _ in self._gauges]
            self._remounts = Counter(*REMOUNTS, ["partition"], registry=registry)
            made.append(self._remounts)
            self._counters = {name: Counter(name, text, registry=registry) for name, text in COUNTERS.items()}
            made += self._counters.values()
            self._histograms = [Histogram(name, text, registry=registry, buckets=source.bounds)
                                for source, (name, text) in self._sources]
            made += self._histograms
            self._queue = Gauge(*QUEUE_LENGTH[:2], registry=registry, multiprocess_mode=QUEUE_LENGTH[2])
            made.append(self._queue)
            self._busy = Counter(*BUSY_SECONDS, registry=registry)
            made.append(self._busy)
        except ValueError:  # a client's metrics are there already: leave the registry as it was
            for metric in made:
                registry.unregister(metric)
            raise
        self._metrics = made
        self._written: dict[object, float] = {}  # what each counter has been increased by so far
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="waltz-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def _increase(self, key: object, child: Any, total: float) -> None:
        delta = total - self._written.get(key, 0.0)
        if delta > 0:
            child.inc(delta)
            self._written[key] = total

    def write(self, *, closing: bool = False) -> None:
        """Write the client's readings (closing: as a closed client's, not mounted, nothing queued)."""
        with self._lock:
            for p in self._client.metric_partitions():
                label = str(p.partition_id)
                for gauge, value in self._gauges:
                    gauge.labels(label).set(0 if closing and gauge is self._mounted else value(p))
                self._increase(("remounts", label), self._remounts.labels(label), p.remounts)
            for name, count in self._client.metric_counters().items():
                self._increase(name, self._counters[name], count)
            for (source, (name, _)), histogram in zip(self._sources, self._histograms, strict=True):
                counts, total = list(source.counts), source.total
                # prometheus_client has no call that adds a count to a bucket: its Histogram keeps a value per
                # bucket (not cumulative, +Inf last, as LatencyHistogram's counts) and one for the sum
                for index, count in enumerate(counts):
                    self._increase((name, index), histogram._buckets[index], count)
                self._increase((name, "sum"), histogram._sum, total)
            queued, busy = self._client.metric_callback_thread()
            self._queue.set(0 if closing else queued)
            self._increase("busy", self._busy, busy)

    def close(self) -> None:
        """Stop the thread, write the last readings, and leave the registry."""
        self._stop.set()
        self._thread.join()
        self.write(closing=True)
        for metric in self._metrics:
            self._registry.unregister(metric)


def _per_partition(partitions: list[PartitionView],
                   gauges: list[tuple[str, str, Callable[[PartitionView], int]]]) -> Iterator[Metric]:
    for name, text, value in gauges:
        family = GaugeMetricFamily(name, text, labels=["partition"])
        for p in partitions:
            family.add_metric([str(p.partition_id)], value(p))
        yield family
