"""OwnLocks: a client's own pending appends' write locks, and the appends parked behind them (issue 31)."""

from __future__ import annotations

from waltz_client.own_locks import OwnLocks


def test_an_append_meeting_its_own_clients_pending_write_lock_is_parked_until_that_one_resolves() -> None:
    own: OwnLocks[str] = OwnLocks()
    assert own.admit("a", [7], [])  # holds 7
    assert own.admit("b", [8], [])  # another lock: sent too
    assert not own.admit("c", [7], [])  # would fail at the server once a commits: parked
    assert not own.admit("d", [9], [7])  # a reader of 7 as well
    assert own.admit("e", [], [8, 10]) is False and own.parked == 3  # behind b
    assert own.release("b", [8]) == ["e"] and own.parked == 2
    assert own.release("a", [7]) == ["c", "d"] and own.parked == 0
    assert own.admit("c", [7], [])  # executed again: nothing holds 7 now
    assert own.release("x", [7]) == []  # not the holder: nothing changes
    assert not own.admit("d", [9], [7])


def test_an_append_may_be_admitted_again_and_release_all_returns_every_parked_one() -> None:
    own: OwnLocks[str] = OwnLocks()
    assert own.admit("a", [7, 8], [])
    assert own.admit("a", [7, 8], [])  # its own locks do not park it
    assert not own.admit("b", [8], [])
    assert not own.admit("c", [7], [])
    assert sorted(own.release_all()) == ["b", "c"] and own.parked == 0
    assert own.admit("b", [8], [])  # the holders were forgotten as well
