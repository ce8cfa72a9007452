"""bench.storage_append's worker appends its requests through a real partition, each one taken (a small run)."""

from pathlib import Path

from bench.storage_append import STEPS, build_requests, measure


def test_every_request_is_appended_and_each_step_is_timed(tmp_path: Path) -> None:
    cpu = measure(build_requests(4, 10, 64), tmp_path)
    assert set(cpu) == set(STEPS) and all(seconds >= 0 for seconds in cpu.values())
    assert sum(cpu.values()) > 0
