"""LockTable: the original's LocksTest scenarios, in-flight conflicts, reset, and no missed conflict."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_server.locks import DEFAULT_SIZE, LockRequest, LockTable

ACCOUNT, PAYMENT = 1001, 3003  # no shared slot in a table of 100


def java_slots(lock_hash: int, size: int) -> list[int]:
    """Locks.java with Java int arithmetic, emulated by truncating to a signed 32-bit int at each step."""
    slots = []
    for _ in range(3):
        lock_hash = ctypes.c_int32(lock_hash * 1103515245 + 12345).value
        slots.append((lock_hash & 0x3FFFFFFF) % size)
    return slots


@pytest.mark.parametrize("lock_hash", [0, 1, -1, 2**31 - 1, -(2**31), 1234567, -7654321])
@pytest.mark.parametrize("size", [DEFAULT_SIZE, 100, 7])
def test_slots_are_the_originals(lock_hash: int, size: int) -> None:
    assert list(LockTable(-1, size).slots(lock_hash)) == java_slots(lock_hash, size)


def test_pinned_slots() -> None:
    assert LockTable(-1).slots(0) == (12345, 10782, 13775)


def write(*locks: int) -> LockRequest:
    return LockRequest(write=locks)


def read(*locks: int) -> LockRequest:
    return LockRequest(read=locks)


def commit(table: LockTable, request: LockRequest, transaction_id: int) -> None:
    assert table.begin(request)
    table.commit(request, transaction_id)
    table.end(request)


def test_write_write_conflict() -> None:
    table = LockTable(-1, 100)
    assert table.check(write(ACCOUNT), client_high_water_mark=-1) is None
    commit(table, write(ACCOUNT), 10)
    assert table.check(write(ACCOUNT), client_high_water_mark=9) == 10  # it did not see transaction 10
    assert table.check(write(ACCOUNT), client_high_water_mark=10) is None
    assert table.check(write(PAYMENT), client_high_water_mark=-1) is None


def test_multiple_write_locks() -> None:
    table = LockTable(-1, 100)
    commit(table, write(ACCOUNT, PAYMENT), 10)
    commit(table, write(ACCOUNT), 11)
    assert table.lock_high_water_mark(write(ACCOUNT)) == 11
    assert table.lock_high_water_mark(write(PAYMENT)) == 10
    assert table.lock_high_water_mark(write(ACCOUNT, PAYMENT)) == 11
    commit(table, write(PAYMENT), 12)
    assert table.lock_high_water_mark(LockRequest(write=(ACCOUNT,), read=(PAYMENT,))) == 12


def test_read_after_write_is_checked_but_not_recorded() -> None:
    table = LockTable(-1, 100)
    commit(table, write(ACCOUNT), 10)
    assert table.check(read(ACCOUNT), client_high_water_mark=9) == 10
    commit(table, read(ACCOUNT), 11)  # a read lock does not record transaction 11
    assert table.check(read(ACCOUNT), client_high_water_mark=10) is None
    assert table.check(write(ACCOUNT), client_high_water_mark=10) is None


def test_append_lock_is_recorded_but_not_checked() -> None:
    table = LockTable(-1, 100)
    commit(table, write(ACCOUNT), 10)
    assert table.check(LockRequest(append=(ACCOUNT,)), client_high_water_mark=-1) is None
    assert table.lock_high_water_mark(LockRequest(append=(ACCOUNT,))) == -1
    commit(table, LockRequest(append=(ACCOUNT,)), 11)
    assert table.check(read(ACCOUNT), client_high_water_mark=10) == 11


def test_hierarchical_resource() -> None:
    """Children are modified under a read lock on the parent and an append lock on the child: many child
    modifications do not conflict with each other, but reading the whole resource sees them all."""
    parent, child = 12345, 6789
    table = LockTable(-1, 100)
    whole = write(parent, child)
    modify_child = LockRequest(read=(parent,), append=(child,))
    assert table.lock_high_water_mark(whole) == -1
    commit(table, whole, 100)
    assert table.lock_high_water_mark(modify_child) == 100
    commit(table, modify_child, 101)
    assert table.check(modify_child, client_high_water_mark=100) is None  # no conflict with transaction 101
    commit(table, modify_child, 102)
    assert table.check(whole, client_high_water_mark=101) == 102
    assert table.lock_high_water_mark(whole) == 102


def test_in_flight_write_holds_back_every_kind_of_lock_on_it() -> None:
    table = LockTable(-1, 100)
    first = write(ACCOUNT)
    assert table.begin(first)
    for kind in ("write", "read", "append"):
        assert not table.begin(LockRequest(**{kind: (ACCOUNT,)}))
    assert table.num_in_flight == 1
    assert table.begin(read(PAYMENT))
    table.commit(first, 10)
    table.end(first)
    assert table.begin(read(ACCOUNT))
    assert table.check(read(ACCOUNT), client_high_water_mark=9) == 10


def test_in_flight_append_holds_back_but_in_flight_read_does_not() -> None:
    table = LockTable(-1, 100)
    assert table.begin(read(ACCOUNT))
    assert table.begin(write(ACCOUNT))  # the read is not recorded: nothing to wait for
    table.end(write(ACCOUNT))
    assert table.begin(LockRequest(append=(PAYMENT,)))
    assert not table.begin(read(PAYMENT))
    table.end(LockRequest(append=(PAYMENT,)))  # failed: nothing recorded
    assert table.begin(read(PAYMENT))
    assert table.check(read(PAYMENT), client_high_water_mark=-1) is None


def test_shared_slot_gives_a_false_in_flight_conflict_but_not_a_false_lock_failure() -> None:
    table = LockTable(-1, 100)
    a, b = 1234567, -7654321  # both use slot 84
    assert set(table.slots(a)) & set(table.slots(b))
    assert table.begin(write(a))
    assert not table.begin(write(b))  # a false positive: b waits for a
    table.commit(write(a), 10)
    table.end(write(a))
    assert table.check(write(b), client_high_water_mark=-1) is None  # its other slots still say -1


def test_reset() -> None:
    table = LockTable(-1, 100)
    commit(table, write(ACCOUNT), 10)
    assert table.begin(write(PAYMENT))
    table.reset(50)
    assert table.num_in_flight == 0
    assert table.begin(write(PAYMENT))
    table.end(write(PAYMENT))
    table.end(write(PAYMENT))  # begun before the reset: ignored
    assert table.num_in_flight == 0
    assert table.check(write(ACCOUNT), client_high_water_mark=49) == 50  # fails once after a failover
    assert table.check(write(ACCOUNT), client_high_water_mark=50) is None
    assert table.check(LockRequest(), client_high_water_mark=-1) is None


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        LockTable(-1, 0)


LOCKS = st.lists(st.integers(0, 40) | st.integers(-(2**31), 2**31 - 1), max_size=3).map(tuple)
REQUESTS = st.builds(LockRequest, write=LOCKS, read=LOCKS, append=LOCKS)
# Per step: a new request (with how far behind its client is) or the oldest in-flight one resolves.
STEPS = st.lists(st.tuples(REQUESTS, st.integers(0, 5)) | st.sampled_from(["commit", "fail"]), max_size=60)


@settings(max_examples=200)
@given(size=st.integers(1, 60), initial=st.integers(-1, 5), steps=STEPS)
def test_collisions_give_false_conflicts_only(size: int, initial: int, steps: list) -> None:
    """An exact model (a dict of locks) decides conflicts; whenever it sees one, the table must too."""
    table = LockTable(initial, size)
    last_write: dict[int, int] = {}  # lock -> last committed transaction that wrote or appended it
    in_flight: list[LockRequest] = []
    high_water_mark = initial
    for step in steps:
        if isinstance(step, str):
            if not in_flight:
                continue
            request = in_flight.pop(0)
            if step == "commit":
                high_water_mark += 1
                table.commit(request, high_water_mark)
                for lock in (*request.write, *request.append):
                    last_write[lock] = high_water_mark
            table.end(request)
            continue
        request, behind = step
        busy = {lock for r in in_flight for lock in (*r.write, *r.append)}
        exact_in_flight = bool(busy & {*request.write, *request.read, *request.append})
        begun = table.begin(request)
        if exact_in_flight:
            assert not begun
        if not begun:
            continue
        client = high_water_mark - behind
        exact = max((last_write.get(lock, initial) for lock in (*request.write, *request.read)), default=-1)
        conflict = table.check(request, client)
        if exact > client:
            assert conflict is not None and exact <= conflict <= high_water_mark
        if conflict is not None:
            table.end(request)
        else:
            in_flight.append(request)
    assert table.num_in_flight == len(in_flight)


def test_remembered_slots_are_the_originals_past_the_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table remembers the slots of the locks and requests it saw (bounded): the answers are those computed afresh,
    also after the memory filled up and started again, and for an equal request made anew."""
    import random

    from waltz_server import locks

    monkeypatch.setattr(locks, "SLOT_CACHE_LOCKS", 5)
    rng = random.Random(34)
    table, fresh = LockTable(-1, 101), LockTable(-1, 101)
    for transaction_id in range(200):
        hashes = [rng.randint(-(2**31), 2**31 - 1) for _ in range(3)]
        request = LockRequest(write=(hashes[0],), read=(hashes[1],), append=(hashes[2],))
        for h in hashes:
            assert list(table.slots(h)) == java_slots(h, 101)
        again = LockRequest(write=(hashes[0],), read=(hashes[1],), append=(hashes[2],))
        for t in (table, fresh):
            t.commit(request if t is table else again, transaction_id)
        assert table.lock_high_water_mark(again) == fresh.lock_high_water_mark(request) == transaction_id
        assert table.begin(again) == fresh.begin(request)
        table.end(request)
        fresh.end(again)
        assert table.num_in_flight == fresh.num_in_flight == 0
    assert len(table._slot_cache) <= 5 and len(table._request_cache) <= 5
