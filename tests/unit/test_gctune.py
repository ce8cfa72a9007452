"""The services' garbage-collector settings."""

from __future__ import annotations

import gc

from waltz_common.gctune import OLD_THRESHOLD, YOUNG_THRESHOLD, tune_for_service


def test_tuning_sets_the_thresholds_and_freezes_what_start_up_allocated() -> None:
    before = gc.get_threshold()
    try:
        tune_for_service()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, OLD_THRESHOLD)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
