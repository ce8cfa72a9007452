"""Smoke run of bench.catchup in its --quick form (a 1,000-transaction log): it prints its table with the baseline
of the same run, and stops what it started. Figures are never asserted here (speed is measured in bench/)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from bench import catchup

pytestmark = pytest.mark.slow


def test_the_quick_form_prints_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert catchup.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("load average (1 min): start "), out
    for text in ("catch-up of a 1,000-transaction log", "PostgreSQL, per transaction (baseline)",
                 "PostgreSQL, batched, apply() per row", "PostgreSQL, batched, apply_batch: COPY",
                 "SQLite, per transaction (baseline)", "SQLite, batched, apply_batch: executemany",
                 "no database: data() only", "x baseline", ">= 5,000/s"):
        assert text in out, f"{text!r} missing from:\n{out}"
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
