"""bench.server_path's worker runs its appends through the server's real append path (a small run)."""

import asyncio

import pytest

from bench.server_path import build_messages, run_once


@pytest.mark.parametrize("locks", [False, True])
def test_every_append_is_committed_and_fed_once(locks: bool) -> None:
    committed, wall, cpu = asyncio.run(run_once(build_messages(4, 25, locks), 25))
    assert committed == 100 and wall > 0 and cpu > 0
