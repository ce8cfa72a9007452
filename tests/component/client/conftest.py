"""Every client component test runs in both callback modes (client.callbackThread true and false), unless
marked callback_modes(...): callbacks that block, or that fetch another client's data, need the thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.component.client import helpers

MODES = {"thread": True, "loop": False}  # the test id's suffix -> client.callbackThread


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "callback_modes(*modes): run only in these of 'thread' and 'loop' (client.callbackThread)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "callback_mode" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("callback_modes")
        modes = list(marker.args) if marker is not None else list(MODES)
        assert set(modes) <= set(MODES), modes
        metafunc.parametrize("callback_mode", modes, indirect=True)


@pytest.fixture(autouse=True)
def callback_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """helpers.FAST (which every test's configuration starts from) with this mode's client.callbackThread."""
    mode: str = request.param
    monkeypatch.setitem(helpers.FAST, "client.callbackThread", MODES[mode])
    yield mode
