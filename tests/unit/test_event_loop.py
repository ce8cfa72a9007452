"""The services' event loop: uvloop by default, asyncio's own on request, a clear error otherwise."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from waltz_common import event_loop
from waltz_common.config import ConfigError


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENVIRONMENT_VARIABLE, raising=False)
    assert issubclass(event_loop.run(_loop_type()), uvloop.Loop)


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENVIRONMENT_VARIABLE, "asyncio")
    loop_type = event_loop.run(_loop_type())
    assert not issubclass(loop_type, uvloop.Loop) and issubclass(loop_type, asyncio.BaseEventLoop)


def test_another_choice_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENVIRONMENT_VARIABLE, "trio")
    with pytest.raises(ConfigError, match="WALTZ_EVENT_LOOP='trio'"):
        event_loop.loop_factory()
