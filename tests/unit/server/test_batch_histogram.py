"""BatchHistogram: a batch of observations at once, exposed like prometheus_client's own Histogram."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from waltz_server.metrics import BatchHistogram

BOUNDS = (0.001, 0.01, 0.1, 1.0)


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value for family in registry.collect() for s in family.samples
        if s.name.startswith(name)
    }


@given(st.lists(st.lists(st.floats(0, 3, allow_nan=False), max_size=20), max_size=10))
def test_same_exposition_as_observing_one_by_one(batches: list[list[float]]) -> None:
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = BatchHistogram("lat_seconds", "latency", BOUNDS)
    mine.register(histogram)
    reference = Histogram("lat_seconds", "latency", buckets=BOUNDS, registry=theirs)
    for batch in batches:
        histogram.observe_many(batch)
        for value in batch:
            reference.observe(value)
    got, want = samples(mine, "lat_seconds"), samples(theirs, "lat_seconds")
    want.pop(("lat_seconds_created", ""), None)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6, key


def test_a_value_on_a_bound_falls_in_that_bucket() -> None:
    registry = CollectorRegistry()
    histogram = BatchHistogram("x_seconds", "x", BOUNDS)
    registry.register(histogram)
    histogram.observe_many([0.01, 0.01, 5.0])
    assert registry.get_sample_value("x_seconds_bucket", {"le": "0.001"}) == 0
    assert registry.get_sample_value("x_seconds_bucket", {"le": "0.01"}) == 2
    assert registry.get_sample_value("x_seconds_bucket", {"le": "+Inf"}) == 3
    assert registry.get_sample_value("x_seconds_count") == 3


@given(st.lists(st.lists(st.tuples(st.floats(0, 3, allow_nan=False), st.integers(1, 5)), max_size=10), max_size=8))
def test_counted_observations_expose_as_each_one_observed(batches: list[list[tuple[float, int]]]) -> None:
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = BatchHistogram("lat_seconds", "latency", BOUNDS)
    mine.register(histogram)
    reference = Histogram("lat_seconds", "latency", buckets=BOUNDS, registry=theirs)
    for batch in batches:
        histogram.observe_counted(batch)
        for value, count in batch:
            for _ in range(count):
                reference.observe(value)
    got, want = samples(mine, "lat_seconds"), samples(theirs, "lat_seconds")
    want.pop(("lat_seconds_created", ""), None)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6, key
