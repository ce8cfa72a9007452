"""StorageMetrics: the append counters and fsync histogram, and the per-partition gauges read when scraped."""

import pytest

from waltz_storage.metrics import StorageMetrics


def test_partition_gauges_are_read_from_the_watched_partitions_when_scraped():
    metrics = StorageMetrics()
    states = [(0, 5, -1, 2), (1, 7, 3, 4)]

    def gauges(partition: int) -> list[float | None]:
        get = metrics.registry.get_sample_value
        labels = {"partition": str(partition)}
        return [
            get("waltz_storage_partition_max_transaction_id", labels),
            get("waltz_storage_partition_low_water_mark", labels),
            get("waltz_storage_partition_session_id", labels),
        ]

    assert gauges(0) == [None, None, None]  # nothing watched yet
    metrics.watch_partitions(lambda: states)
    assert gauges(0) == [5, -1, 2] and gauges(1) == [7, 3, 4]
    states[0] = (0, 6, -1, 2)
    del states[1]  # unassigned: its gauges go
    assert gauges(0) == [6, -1, 2] and gauges(1) == [None, None, None]


def test_appends_are_counted_and_their_fsyncs_timed_under_the_usual_names():
    metrics = StorageMetrics()
    get = metrics.registry.get_sample_value
    metrics.appended(3, 30, 3000, 0.0002)
    metrics.appended(1, 0, 0, None)  # nothing written: no fdatasync to time
    metrics.appended(1, 5, 500, 0.0001)
    metrics.appended(1, 5, 500, 7.0)
    assert get("waltz_storage_append_requests_total") == 6
    assert get("waltz_storage_appended_records_total") == 40
    assert get("waltz_storage_appended_bytes_total") == 4000
    assert get("waltz_storage_fsync_duration_seconds_count") == 3
    assert get("waltz_storage_fsync_duration_seconds_sum") == pytest.approx(7.0003)
    bucket = {
        le: get("waltz_storage_fsync_duration_seconds_bucket", {"le": le})
        for le in ("5e-05", "0.0001", "0.00025", "2.5", "+Inf")
    }
    assert bucket == {"5e-05": 0, "0.0001": 1, "0.00025": 2, "2.5": 2, "+Inf": 3}
