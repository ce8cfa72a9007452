"""OwnLocks: a client's own pending appends' write locks, and the appends parked behind them (issue 31).

A freed lock goes to the first append parked behind it only (FIFO), which holds it while it executes again; every
end of the append that holds it hands it on, or a parked append waits for ever: each end path has a test here, and
a randomized shell checks that no token is ever left parked behind a lock nobody holds."""

from __future__ import annotations

import random

import pytest

from waltz_client.own_locks import OwnLocks


def test_an_append_meeting_its_own_clients_pending_write_lock_is_parked_until_that_one_resolves() -> None:
    own: OwnLocks[str] = OwnLocks()
    assert own.admit("a", [7], []) == (True, [])  # holds 7
    assert own.admit("b", [8], []) == (True, [])  # another lock: sent too
    assert own.admit("c", [7], []) == (False, [])  # would fail at the server once a commits: parked
    assert own.admit("d", [9], [7]) == (False, [])  # a reader of 7 as well
    assert own.admit("e", [], [8, 10]) == (False, []) and own.parked == 3  # behind b
    assert own.release("b") == ["e"] and own.parked == 2 and own.holder(8) == "e"
    assert own.admit("e", [], [8, 10]) == (True, []) and own.holder(8) is None  # a reader holds nothing once sent
    assert own.release("x") == []  # unknown: nothing changes
    own.check()


def test_a_freed_lock_goes_to_the_first_parked_append_only_which_holds_it_while_it_executes_again() -> None:
    own: OwnLocks[str] = OwnLocks()
    own.admit("a", [7], [])
    for token in ("b", "c", "d"):  # (literals: tokens are compared by identity)
        assert own.admit(token, [7], []) == (False, [])
    assert own.release("a") == ["b"]  # committed: b executes again, c and d stay parked
    assert own.holder(7) == "b" and own.parked == 2 and own.parked_on("c") == 7
    assert own.admit("e", [7], []) == (False, [])  # a new append queues behind them
    assert own.admit("b", [7], []) == (True, [])  # b built its append on fresh state: sent, still the holder
    assert own.release("b") == ["c"]
    assert own.admit("c", [7], []) == (True, [])
    assert own.release("c") == ["d"]
    assert own.release("d") == ["e"]  # d declined (or failed) after being handed the lock: it goes on
    assert own.release("e") == [] and own.holder(7) is None and own.parked == 0
    own.check()


def test_a_lock_failure_hands_the_lock_on_and_the_retry_queues_behind() -> None:
    own: OwnLocks[str] = OwnLocks()
    own.admit("a", [7], [])
    own.admit("b", [7], [])
    assert own.release("a") == ["b"]  # a's lock failure is final: b executes again first
    assert own.admit("a", [7], []) == (False, [])  # a's retry
    assert own.release("b") == ["a"]
    own.check()


def test_an_append_handed_a_lock_that_executes_again_with_other_locks_hands_it_on() -> None:
    own: OwnLocks[str] = OwnLocks()
    own.admit("a", [7], [])
    own.admit("b", [7], [])
    own.admit("c", [7], [])
    assert own.release("a") == ["b"]
    assert own.admit("b", [8], []) == (True, ["c"])  # b now writes 8 only: 7 goes to c at once
    assert own.holder(7) == "c" and own.holder(8) == "b"
    assert own.admit("c", [], []) == (True, [])  # c executed again without locks: it holds nothing
    assert own.holder(7) is None and not own.holds("c")
    own.check()


def test_an_append_handed_a_lock_that_meets_another_held_lock_parks_there_and_hands_its_lock_on() -> None:
    own: OwnLocks[str] = OwnLocks()
    own.admit("x", [8], [])  # sent, holds 8
    own.admit("a", [7], [])
    own.admit("b", [7], [])
    own.admit("c", [7], [])
    assert own.release("a") == ["b"]
    assert own.admit("b", [7, 8], []) == (False, ["c"])  # parked behind x; a parked append holds nothing
    assert own.parked_on("b") == 8 and own.holder(7) == "c" and not own.holds("b")
    own.check()
    assert own.release("x") == ["b"]


def test_a_parked_append_that_ends_leaves_its_queue_and_may_not_be_admitted_while_parked() -> None:
    own: OwnLocks[str] = OwnLocks()
    own.admit("a", [7], [])
    own.admit("b", [7], [])
    own.admit("c", [7], [])
    with pytest.raises(ValueError):
        own.admit("b", [7], [])
    assert own.release("b") == [] and own.parked == 1  # cancelled while parked
    assert own.release("a") == ["c"]
    own.check()


def test_an_append_may_be_admitted_again_and_release_all_returns_every_parked_one() -> None:
    own: OwnLocks[str] = OwnLocks()
    assert own.admit("a", [7, 8], []) == (True, [])
    assert own.admit("a", [7, 8], []) == (True, [])  # its own locks do not park it
    assert own.admit("b", [8], [])[0] is False
    assert own.admit("c", [7], [])[0] is False
    assert own.admit("d", [7], [])[0] is False
    assert own.release_all() == ["b", "c", "d"] and own.parked == 0  # closing, or the partition failed
    assert own.admit("b", [8], []) == (True, [])  # the holders were forgotten as well
    assert own.release("a") == []  # a holder's end after release_all: a no-op
    own.check()


class _Shell:
    """The states submission.py keeps a token in, for the randomized test."""

    def __init__(self, tokens: int, rng: random.Random) -> None:
        self.own: OwnLocks[int] = OwnLocks()
        self.executing: set[int] = set(range(tokens))
        self.sent: set[int] = set()
        self.parked: set[int] = set()
        self.ended: set[int] = set()
        self.retries = {token: rng.randrange(4) for token in self.executing}

    def run(self, handed: list[int]) -> None:
        """The tokens handed a lock execute again."""
        for token in handed:
            assert token in self.parked, "handed a lock while not parked"
            self.parked.discard(token)
            self.executing.add(token)

    def step(self, rng: random.Random) -> None:
        own = self.own
        if self.executing and (rng.random() < 0.6 or not self.sent):
            token = rng.choice(sorted(self.executing))
            self.executing.discard(token)
            if rng.random() < 0.1:  # declined, or execute() raised
                self.run(own.release(token))
                self.ended.add(token)
                return
            admitted, handed = own.admit(token, rng.sample(range(4), rng.randrange(3)),
                                         rng.sample(range(4), rng.randrange(2)))
            (self.sent if admitted else self.parked).add(token)
            self.run(handed)
        elif self.sent:
            token = rng.choice(sorted(self.sent))
            self.sent.discard(token)
            self.run(own.release(token))  # committed, lock failure, failure, timeout, cancelled
            if self.retries[token]:
                self.retries[token] -= 1
                self.executing.add(token)
            else:
                self.ended.add(token)
        if rng.random() < 0.01:  # the partition failed: every parked append executes again (and ends)
            for token in own.release_all():
                self.parked.discard(token)
                self.ended.add(token)
            for token in self.executing | self.sent:
                assert own.release(token) == []
            self.ended |= self.executing | self.sent
            self.executing.clear()
            self.sent.clear()

    def check(self) -> None:
        own = self.own
        own.check()
        assert own.parked == len(self.parked)
        moving = self.executing | self.sent
        for token in self.parked:  # someone who will move holds each awaited lock
            lock = own.parked_on(token)
            assert lock is not None and own.holder(lock) in moving


def test_randomized_shell_never_leaves_a_token_parked_behind_a_lock_nobody_holds() -> None:
    """A shell as submission.py drives it: executing tokens are admitted (sent, or parked) or end (declined,
    raised); sent ones are resolved (committed, or failed and executed again); handed tokens execute again;
    sometimes the partition fails (release_all: the parked execute again). Invariants after every step; at the
    end every token ended, nothing is held or parked."""
    for seed in range(200):
        rng = random.Random(seed)
        shell = _Shell(12, rng)
        for _ in range(20_000):
            if not (shell.executing or shell.sent):
                break
            shell.step(rng)
            shell.check()
        assert not shell.parked and not shell.executing and not shell.sent, seed
        assert len(shell.ended) == 12 and shell.own.parked == 0
        assert all(shell.own.holder(lock) is None for lock in range(4))
