"""StorageMetrics: the per-partition gauges follow partition_state, and a forgotten partition starts afresh."""

from waltz_storage.metrics import StorageMetrics


def test_partition_gauges_follow_the_state_and_forget_removes_them():
    metrics = StorageMetrics()

    def gauges(partition: int) -> list[float | None]:
        get = metrics.registry.get_sample_value
        labels = {"partition": str(partition)}
        return [
            get("waltz_storage_partition_max_transaction_id", labels),
            get("waltz_storage_partition_low_water_mark", labels),
            get("waltz_storage_partition_session_id", labels),
        ]

    metrics.partition_state(0, 5, -1, 2)
    metrics.partition_state(1, 7, 3, 4)
    metrics.partition_state(0, 6, -1, 2)
    assert gauges(0) == [6, -1, 2] and gauges(1) == [7, 3, 4]
    metrics.forget_partition(0)
    assert gauges(0) == [None, None, None] and gauges(1) == [7, 3, 4]
    metrics.partition_state(0, 6, -1, 2)  # the same values as before it was forgotten are set again
    assert gauges(0) == [6, -1, 2]
