"""Smoke run of bench.web_service in a short form (two wallet instances, 10 s): it prints its per-window table, the
service keeps its invariant under load from both instances (no error, no negative balance, identical databases),
and it stops what it started. Figures are never asserted here (speed is measured in bench/)."""

from __future__ import annotations

import psutil
import pytest

from bench import web_service

pytestmark = pytest.mark.slow


def test_a_short_run_prints_its_windows_and_the_wallets_hold(capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    web_service.main(["--postgres", "--seconds", "10", "--instances", "2", "--connections", "3"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith(("0-5", "5-10"))]
    assert len(rows) == 2, out
    assert "errors 0; databases identical: True; negative balances: 0" in out, out
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
