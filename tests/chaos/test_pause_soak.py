"""No false failovers, bounded: bench/pause_soak.py for 45 s (WALTZ_PAUSE_SOAK_SECONDS) with 100 writers and a 1 s
SIGSTOP of partition 0's owner every 15 s; `python -m bench.pause_soak` is the 10-minute form."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.pause_soak import run_pause_soak

SECONDS = float(os.environ.get("WALTZ_PAUSE_SOAK_SECONDS", "45"))


@pytest.mark.slow
@pytest.mark.timeout(SECONDS + 300)
def test_one_second_pauses_of_a_busy_owner_move_no_partition(tmp_path: Path) -> None:
    outcome = run_pause_soak(tmp_path, SECONDS, writers=100, pause_s=1.0, every_s=15.0)
    print("\n".join(outcome.summary()))
    assert outcome.pauses >= 2
    assert outcome.commits > 0
    assert not outcome.moved, outcome.summary()
    assert outcome.rewrites == 0, outcome.summary()
