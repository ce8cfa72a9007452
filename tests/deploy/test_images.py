"""The container test's image-build budget (tests/deploy/images.py): its default, the variable that changes it, and
a deadline that, once spent, stops the next build step with a message naming the budget."""

from __future__ import annotations

import time

import pytest

from tests.deploy import images


def test_the_budget_defaults_and_follows_the_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(images.BUDGET_VARIABLE, raising=False)
    assert images.budget() == images.IMAGE_BUILD_BUDGET_S > 300  # more than pytest's per-test timeout
    monkeypatch.setenv(images.BUDGET_VARIABLE, "3600")
    assert images.budget() == 3600
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv(images.BUDGET_VARIABLE, bad)
        with pytest.raises(ValueError, match=images.BUDGET_VARIABLE):
            images.budget()


def test_a_spent_budget_stops_the_next_step():
    assert 0 < images.remaining(time.monotonic() + 10) <= 10
    with pytest.raises(TimeoutError, match="budget is spent"):
        images.remaining(time.monotonic() - 1)
