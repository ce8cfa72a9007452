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

        # Per partition: its three gauge children and the values they hold (set only when they change).
        self._partitions: dict[int, tuple[list[Gauge], list[int]]] = {}

    def partition_state(self, partition_id: int, max_transaction_id: int, low_water_mark: int, session_id: int) -> None:
        """Called after every request: the label lookups are done once per partition, unchanged values skipped."""
        known = self._partitions.get(partition_id)
        if known is None:
            label = str(partition_id)
            gauges = [g.labels(label) for g in (self.max_transaction_id, self.low_water_mark, self.session_id)]
            known = self._partitions[partition_id] = (gauges, [None, None, None])  # type: ignore[list-item]
        gauges, values = known
        for i, value in enumerate((max_transaction_id, low_water_mark, session_id)):
            if values[i] != value:
                gauges[i].set(value)
                values[i] = value

    def forget_partition(self, partition_id: int) -> None:
        self._partitions.pop(partition_id, None)
        label = str(partition_id)
        for gauge in (self.max_transaction_id, self.low_water_mark, self.session_id):
            try:
                gauge.remove(label)
            except KeyError:
                pass
