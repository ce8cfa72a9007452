"""Client metrics for Prometheus: a collector that reads the client's counters and partitions at scrape time.

Nothing here runs per append: LatencyHistogram.observe_counted (a bisect and two additions, no lock, no label lookup)
runs once per run of a feed message's own appends that were sent together, and the counters are the plain integers
the client keeps anyway (Stats), read when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

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


class ClientCollector(Collector):
    """Exposes one client's metrics; register it in a CollectorRegistry (one client per registry)."""

    def __init__(self, client: ClientView, latency: LatencyHistogram,
                 lock_failure_latency: LatencyHistogram | None = None) -> None:
        self._client = client
        self._latency = latency
        self._lock_failure_latency = lock_failure_latency if lock_failure_latency is not None else LatencyHistogram()

    def collect(self) -> Iterator[Metric]:
        partitions = self._client.metric_partitions()
        yield from _per_partition(partitions, [
            ("waltz_client_partition_mounted", "1 when the partition is mounted (appends allowed), else 0",
             lambda p: 1 if p.mounted else 0),
            ("waltz_client_partition_client_high_water_mark",
             "the highest transaction id this client has applied (-1: none)", lambda p: p.client_high_water_mark),
            ("waltz_client_partition_server_high_water_mark",
             "the highest transaction id the client has heard its server committed (mount, feed, flush answers)",
             lambda p: p.server_high_water_mark),
            ("waltz_client_partition_lag_transactions",
             "committed transactions the client has not applied yet, received or not (the server's high-water mark, "
             "heard with every feed message and flush answer as it arrives, and asked every 2 s while the client's "
             "stream is backed up, minus the client's)",
             lambda p: max(0, p.server_high_water_mark - p.client_high_water_mark)),
            ("waltz_client_partition_pending_appends", "appends sent and not resolved yet",
             lambda p: p.pending_appends),
            ("waltz_client_partition_catchup_remaining_transactions",
             "transactions still to apply before the partition's mount completes (a mount waits for the catch-up "
             "feed to be applied; the target is the server's high-water mark, asked as the mount is sent and every "
             "few seconds while mounting); 0 when mounted; -1 while not mounted and the target not known yet",
             lambda p: p.catchup_remaining),
        ])
        remounts = CounterMetricFamily("waltz_client_remounts", "mounts of the partition after its first one "
                                       "(a lost stream, a new generation, a moved partition, a feed gap)",
                                       labels=["partition"])
        for p in partitions:
            remounts.add_metric([str(p.partition_id)], p.remounts)
        yield remounts
        values = self._client.metric_counters()
        for name, text in COUNTERS.items():
            yield CounterMetricFamily(name, text, value=values[name])
        buckets, total = self._latency.cumulative()
        yield HistogramMetricFamily(
            "waltz_client_append_latency_seconds",
            "from sending an append to its commit arriving in the feed (per attempt that committed)",
            buckets=buckets, sum_value=total)
        buckets, total = self._lock_failure_latency.cumulative()
        yield HistogramMetricFamily(
            "waltz_client_lock_failure_latency_seconds",
            "from sending an append to its lock failure arriving (per attempt that failed its lock check)",
            buckets=buckets, sum_value=total)
        queued, busy = self._client.metric_callback_thread()
        yield GaugeMetricFamily("waltz_client_callback_queue_length",
                                "jobs (feed applies, execute() calls, hooks) waiting for the callback thread or in "
                                "the batch it runs: a queue that stays long is a thread that cannot keep up",
                                value=queued)
        yield CounterMetricFamily("waltz_client_callback_busy_seconds",
                                  "time the callback thread spent running application code (its rate near 1: always "
                                  "busy)", value=busy)

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def _per_partition(partitions: list[PartitionView],
                   gauges: list[tuple[str, str, Callable[[PartitionView], int]]]) -> Iterator[Metric]:
    for name, text, value in gauges:
        family = GaugeMetricFamily(name, text, labels=["partition"])
        for p in partitions:
            family.add_metric([str(p.partition_id)], value(p))
        yield family
