"""The soak (tests/chaos/soak.py) in bounded form: random faults for 45 s under load (WALTZ_SOAK_SECONDS), then the
history check; `scripts/soak --minutes N` is the long form."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos.soak import run_soak

SECONDS = float(os.environ.get("WALTZ_SOAK_SECONDS", "45"))


@pytest.mark.slow
@pytest.mark.timeout(SECONDS + 600)
def test_random_faults_under_load_lose_nothing_and_commit_nothing_twice(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    outcome = run_soak(tmp_path, SECONDS, seed)
    print("\n".join(outcome.summary()))
    assert not outcome.violations, f"seed {seed}, run kept in {tmp_path}: {outcome.violations}"
    assert outcome.recoveries, "no fault was done"
    # every submission ended: acknowledged, or reported failed after client.maxRetries proven failures (lock failures)
    assert outcome.acknowledged + outcome.failed == outcome.submitted
