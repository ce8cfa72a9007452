"""Smoke run of bench.round in its --quick form without the open loop (about a minute): both sides' clusters, the
floors and the ratios print, and everything it started is stopped. Figures are never asserted here."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from bench import round as round_bench

pytestmark = pytest.mark.slow


def test_the_quick_form_prints_every_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert round_bench.main(["--quick", "--skip-open-loop", "--baseline", "HEAD", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("load average (1 min): start "), out
    for text in ("1. CPU us per committed append", "Python client, 10 in flight", "raw client, 1 in flight",
                 "storage-2 CPU us", "grpc.aio stream round: server CPU us", "fdatasync of a 512 B append",
                 "framed storage round (candidate's port)",
                 "Python client, 1 in flight: server-0 / grpc round's server"):
        assert text in out, f"{text!r} missing from:\n{out}"
    assert "4. open loop" not in out
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
