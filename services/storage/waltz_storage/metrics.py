"""The storage node's Prometheus metrics, kept in a registry of their own (one per node)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# From 50 microseconds (a write-back cache) up to seconds (a struggling disk).
FSYNC_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StorageMetrics:
    """Counters, the fsync histogram and per-partition gauges of one storage node."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.append_requests = Counter(
            "waltz_storage_append_requests_total", "Append requests that were acknowledged", registry=r
        )
        self.appended_records = Counter("waltz_storage_appended_records_total", "Records durably appended", registry=r)
        self.appended_bytes = Counter(
            "waltz_storage_appended_bytes_total", "Bytes durably appended to segment data files", registry=r
        )
        self.fsync_duration = Histogram(
            "waltz_storage_fsync_duration_seconds",
            "Duration of one durable batch write: the data write and its fdatasync",
            buckets=FSYNC_BUCKETS,
            registry=r,
        )
        self.max_transaction_id = Gauge(
            "waltz_storage_partition_max_transaction_id", "Highest stored transaction id", ["partition"], registry=r
        )
        self.low_water_mark = Gauge(
            "waltz_storage_partition_low_water_mark",
            "Low-water mark of the last store session",
            ["partition"],
            registry=r,
        )
        self.session_id = Gauge(
            "waltz_storage_partition_session_id", "Highest store session id seen", ["partition"], registry=r
        )
        self.request_failures = Counter(
            "waltz_storage_request_failures_total",
            "Requests answered with a Failure, by error code",
            ["code"],
            registry=r,
        )

    def partition_state(self, partition_id: int, max_transaction_id: int, low_water_mark: int, session_id: int) -> None:
        label = str(partition_id)
        self.max_transaction_id.labels(label).set(max_transaction_id)
        self.low_water_mark.labels(label).set(low_water_mark)
        self.session_id.labels(label).set(session_id)

    def forget_partition(self, partition_id: int) -> None:
        label = str(partition_id)
        for gauge in (self.max_transaction_id, self.low_water_mark, self.session_id):
            try:
                gauge.remove(label)
            except KeyError:
                pass
