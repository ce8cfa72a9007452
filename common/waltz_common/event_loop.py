"""The event loop the Waltz processes run on: uvloop (libuv) unless the operator asks for asyncio's own.

Every message, append and feed entry of a service passes through a handful of loop callbacks and task
steps, and asyncio's pure-Python loop spends much of a service's CPU there. With uvloop the 100-writer
append benchmark on the 2-core development machine used about 20% less CPU per append in the server, the
storage nodes and the client (server 28-36 -> 25-26 us, three storage nodes 32-36 -> 27-28 us), and
committed 14,200-16,500 instead of 11,000-13,300 appends/s in the same hour (interleaved runs).

WALTZ_EVENT_LOOP=asyncio (in the environment) selects asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

from waltz_common.config import ConfigError

T = TypeVar("T")

ENVIRONMENT_VARIABLE = "WALTZ_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop chosen by WALTZ_EVENT_LOOP (None: asyncio's default); ConfigError for
    another value (the mains check it with their configuration)."""
    choice = os.environ.get(ENVIRONMENT_VARIABLE, "uvloop").strip().lower() or "uvloop"
    if choice not in CHOICES:
        raise ConfigError(f"{ENVIRONMENT_VARIABLE}={choice!r}: expected one of {', '.join(CHOICES)}")
    return uvloop.new_event_loop if choice == "uvloop" else None


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
