"""bench.storage_append's worker appends its requests through a real partition, each one taken (a small run), and
checks them with two revisions' code in one process; bench.storage_nodes gives only the storage nodes the
baseline's package."""

import os
from pathlib import Path

from bench.storage_append import STEPS, build_requests, checks_side_by_side, measure
from waltz_storage import batch


def test_every_request_is_appended_and_each_step_is_timed(tmp_path: Path) -> None:
    cpu = measure(build_requests(4, 10, 64), tmp_path)
    assert set(cpu) == set(STEPS) and all(seconds >= 0 for seconds in cpu.values())
    assert sum(cpu.values()) > 0


def test_the_side_by_side_check_runs_both_sides_on_every_request() -> None:
    baseline, candidate = checks_side_by_side(build_requests(6, 10, 64), Path(batch.__file__), 10)
    assert baseline > 0 and candidate > 0


def test_the_baseline_storage_package_goes_first_on_pythonpath_and_only_meanwhile(monkeypatch, tmp_path: Path) -> None:
    from bench.storage_nodes import first_on_pythonpath

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    with first_on_pythonpath(tmp_path):
        assert os.environ["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    with first_on_pythonpath(tmp_path):
        assert os.environ["PYTHONPATH"] == str(tmp_path)
    assert "PYTHONPATH" not in os.environ
    with first_on_pythonpath(None):
        assert "PYTHONPATH" not in os.environ
