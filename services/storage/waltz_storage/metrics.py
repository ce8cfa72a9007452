"""The storage node's Prometheus metrics, kept in a registry of their own (one per node)."""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from waltz.v1 import storage_pb2
from waltz_common import process_metrics

# From 50 microseconds (a write-back cache) up to seconds (a struggling disk).
FSYNC_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _AppendTotals(Collector):
    """The append counters and the fsync histogram, kept as plain numbers under one lock and turned into
    metric families only when scraped: an append costs one lock and a few additions, not five metric calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = 0
        self._records = 0
        self._bytes = 0
        self._fsync_buckets = [0] * (len(FSYNC_BUCKETS) + 1)  # the last one: above the largest bound
        self._fsync_sum = 0.0

    def add(self, requests: int, records: int, size: int, fsync_seconds: float | None) -> None:
        with self._lock:
            self._requests += requests
            self._records += records
            self._bytes += size
            if fsync_seconds is not None:
                self._fsync_buckets[bisect.bisect_left(FSYNC_BUCKETS, fsync_seconds)] += 1
                self._fsync_sum += fsync_seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests, records, size = self._requests, self._records, self._bytes
            counts, total = list(self._fsync_buckets), self._fsync_sum
        yield CounterMetricFamily("waltz_storage_append_requests", "Append requests that were acknowledged", requests)
        yield CounterMetricFamily("waltz_storage_appended_records", "Records durably appended", records)
        yield CounterMetricFamily("waltz_storage_appended_bytes", "Bytes durably appended to segment data files", size)
        bounds = [*(floatToGoString(bound) for bound in FSYNC_BUCKETS), "+Inf"]
        yield HistogramMetricFamily(
            "waltz_storage_fsync_duration_seconds",
            "Duration of one durable batch write: the data write and its fdatasync",
            buckets=list(zip(bounds, itertools.accumulate(counts), strict=True)),
            sum_value=total,
        )


PartitionState = tuple[int, int, int, int]
"""A partition's id, max transaction id, low-water mark and highest session id seen."""


class _PartitionGauges(Collector):
    """The per-partition gauges, read from the partitions when scraped (nothing to do per request)."""

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[PartitionState]] = lambda: ()

    def collect(self) -> Iterator[Metric]:
        families = (
            GaugeMetricFamily(
                "waltz_storage_partition_max_transaction_id", "Highest stored transaction id", labels=["partition"]
            ),
            GaugeMetricFamily(
                "waltz_storage_partition_low_water_mark",
                "Low-water mark of the last store session",
                labels=["partition"],
            ),
            GaugeMetricFamily(
                "waltz_storage_partition_session_id", "Highest store session id seen", labels=["partition"]
            ),
        )
        for partition_id, *values in self.source():
            for family, value in zip(families, values, strict=True):
                family.add_metric([str(partition_id)], value)
        yield from families


class _DamageTotals(Collector):
    """Damage found and not yet repaired, read from the partitions when scraped."""

    def __init__(self) -> None:
        self.source: Callable[[], tuple[int, int]] = lambda: (0, 0)

    def collect(self) -> Iterator[Metric]:
        found, now = self.source()
        yield CounterMetricFamily(
            "waltz_storage_damaged_records_found",
            "Records found failing their checksums inside written data (at start, by a read or by scrubbing)",
            found,
        )
        yield GaugeMetricFamily(
            "waltz_storage_damaged_records", "Records held that fail their checksums and are not repaired yet", now
        )


class StorageMetrics:
    """Counters, the fsync histogram and per-partition gauges of one storage node."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        process_metrics.register(r, "storage")
        self._appends = _AppendTotals()
        r.register(self._appends)
        self._partitions = _PartitionGauges()
        r.register(self._partitions)
        self.request_failures = Counter(
            "waltz_storage_request_failures_total",
            "Requests answered with a Failure, by error code",
            ["code"],
            registry=r,
        )
        for code, _number in storage_pb2.StorageRpcException.ErrorCode.items():  # 0 from the start, not absent
            self.request_failures.labels(code)
        self.records_repaired = Counter(
            "waltz_storage_repaired_records_total",
            "Damaged records rewritten with an intact copy from another replica",
            registry=r,
        )
        self.scrubbed_bytes = Counter(
            "waltz_storage_scrubbed_bytes_total", "Bytes of records re-read and checked by scrubbing", registry=r
        )
        self._damage = _DamageTotals()
        r.register(self._damage)

    def appended(self, requests: int, records: int, size: int, fsync_seconds: float | None) -> None:
        """Requests acknowledged with their records and bytes, and the write + fdatasync time (None: none)."""
        self._appends.add(requests, records, size, fsync_seconds)

    def watch_partitions(self, source: Callable[[], Iterable[PartitionState]]) -> None:
        """Where the per-partition gauges come from: source() lists the partitions' states when scraped."""
        self._partitions.source = source

    def watch_damage(self, source: Callable[[], tuple[int, int]]) -> None:
        """Where the damage figures come from: source() gives (records found damaged, damaged now) when scraped."""
        self._damage.source = source
