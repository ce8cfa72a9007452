"""RecoveryManager: the original's RecoveryManagerTest matrix, the seed's undecidable case, metadata write-back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.server.recovery_harness import SESSION, A, B, C, D, Driver, E, FakeStorage, U, replica
from waltz_server.recovery import (
    CatchUp,
    Recovered,
    RecoveryDecision,
    RecoveryManager,
    ReplicaFacts,
    ReplicaState,
    Resolution,
    SessionFencedError,
    SetLowWaterMark,
    Truncate,
    Wait,
    WaitReason,
    resolve_high_water_mark,
)


def build(
    meta_sessions: list[int],
    meta_closings: list[int],
    storage_sessions: list[int],
    low_water_marks: list[int],
    max_ids: list[int],
    availability: list[bool | None],
) -> tuple[Driver, list[str], list[str]]:
    """The original's test0 set-up. availability None = removed (in the metadata, not assigned)."""
    previous = {
        replica(i): ReplicaState(s, c) for i, (s, c) in enumerate(zip(meta_sessions, meta_closings, strict=True))
    }
    storages = {
        replica(i): FakeStorage.with_records(s, lwm, m)
        for i, (s, lwm, m) in enumerate(zip(storage_sessions, low_water_marks, max_ids, strict=True))
    }
    assigned = [replica(i) for i, a in enumerate(availability) if a is not None]
    available = [replica(i) for i, a in enumerate(availability) if a]
    driver = Driver(RecoveryManager(SESSION, previous, assigned), storages)
    return driver, assigned, available


def check_recovered(driver: Driver, decision: RecoveryDecision, replicas: list[str], lo: int, hi: int) -> int:
    resolved = decision.high_water_mark
    assert resolved is not None and lo <= resolved <= hi
    assert decision.complete
    reference = driver.storages[replicas[0]].log
    for r in replicas:
        storage = driver.storages[r]
        assert storage.session_id == SESSION
        assert storage.low_water_mark == storage.max_transaction_id == resolved
        assert storage.log == reference
        assert decision.actions[r] == Recovered()
    assert set(replicas) <= decision.recovered
    return resolved


def two_phases(*matrix: list[int] | list[bool | None], lo: int = 120, hi: int = 125) -> int:
    """Recover with the available replicas, check, then bring the others online and check again.
    matrix: build's arguments."""
    driver, assigned, available = build(*matrix)  # type: ignore[arg-type]
    driver.connect(*available)
    decision = driver.run()
    resolved = check_recovered(driver, decision, available, lo, hi)
    assert decision.replica_states is not None
    assert sorted(decision.replica_states) == sorted(assigned)
    fresh = [r for r, s in decision.replica_states.items() if s == ReplicaState(SESSION, U)]
    assert sorted(fresh) == sorted(available)

    driver.connect(*(set(assigned) - set(available)))
    decision = driver.run()
    assert check_recovered(driver, decision, assigned, lo, hi) == resolved
    assert decision.replica_states == {r: ReplicaState(SESSION, U) for r in assigned}
    return resolved


ALL5: list[bool | None] = [True] * 5


def test_all_replicas_new() -> None:
    assert two_phases([], [], [-1] * 5, [-1] * 5, [-1] * 5, ALL5, lo=-1, hi=-1) == -1


def test_all_replicas_new_truncates_stale_data() -> None:
    driver, _, available = build([], [], [-1, -1, 5], [-1, -1, 3], [-1, 7, 9], [True] * 3)
    driver.connect(*available)
    assert driver.manager.decide().actions[C] == Truncate(-1)
    check_recovered(driver, driver.run(), available, -1, -1)


@pytest.mark.parametrize(
    ("voters", "meta_sessions", "meta_closings", "storage_sessions", "lwms", "max_ids"),
    [
        (5, [998] * 5, [U] * 5, [998] * 5, [110] * 5, [125, 125, 120, 115, 115]),
        (4, [998] * 4 + [997], [U] * 4 + [100], [998] * 5, [110] * 5, [125, 125, 120, 115, 115]),
        (3, [998] * 3 + [997] * 2, [U] * 3 + [100] * 2, [998] * 5, [110] * 5, [125, 125, 120, 115, 115]),
        (2, [998] * 3 + [997] * 2, [U, U, 110, 110, 110], [998] * 3 + [997] * 2, [110] * 3 + [100] * 2,
         [120] * 3 + [105] * 2),
        (1, [998] * 3 + [997] * 2, [U, 110, 110, 100, 100], [998] * 3 + [997] * 2, [110] * 3 + [100] * 2,
         [120] * 3 + [105] * 2),
    ],
)  # fmt: skip
def test_voting_replicas(
    voters: int,
    meta_sessions: list[int],
    meta_closings: list[int],
    storage_sessions: list[int],
    lwms: list[int],
    max_ids: list[int],
) -> None:
    # With all five online, the highest mark three replicas hold is 120; with fewer than three voters the
    # non-voters (truncated to their closing mark) follow the most advanced replica until 120 has a quorum.
    assert two_phases(meta_sessions, meta_closings, storage_sessions, lwms, max_ids, ALL5) == 120
    driver, _, available = build(meta_sessions, meta_closings, storage_sessions, lwms, max_ids, ALL5)
    driver.connect(*available)
    decision = driver.manager.decide()
    proposers = sum(1 for s in meta_closings if s == U)
    assert proposers == voters
    assert (decision.resolution is Resolution.RESOLVED) == (voters >= 3)


def test_dirty_records_are_truncated() -> None:
    driver, _, available = build(
        [998] * 3 + [997] * 2, [U, 110, 110, 100, 100], [998] * 3 + [997] * 2, [110] * 3 + [100] * 2,
        [120, 120, 130, 105, 105], ALL5,
    )  # fmt: skip
    dirty = driver.storages[C]
    dirty.log[111:] = [f"dirty{i}" for i in range(111, 131)]
    driver.connect(*available)
    assert driver.manager.decide().actions[C] == Truncate(110)
    decision = driver.run()
    assert check_recovered(driver, decision, available, 120, 120) == 120
    assert dirty.log == [f"t{i}" for i in range(121)]


def test_recovery_after_recovery_failure() -> None:
    two_phases([998, 998, 997, 997, 997], [U, U, 120, 120, 120], [998, 998, 997, 997, 997],
               [120, 120, 100, 100, 100], [120, 120, 105, 105, 105], ALL5)  # fmt: skip


def test_recovery_after_recovery_failure_mixed_session_ids() -> None:
    two_phases([998, 998, 997, 996, 996], [U, U, 120, 100, 100], [998, 998, 997, 996, 996],
               [120, 120, 100, 100, 100], [120, 120, 105, 105, 105], ALL5)  # fmt: skip


def test_far_behind_replicas_catch_up_from_the_most_advanced() -> None:
    args = ([998] * 5, [U] * 5, [998] * 5, [120] * 5, [120, 120, 120, 110, 100])
    driver, _, _ = build(*args, [False, False, True, True, True])
    driver.connect(C, D, E)
    decision = driver.manager.decide()
    assert decision.resolution is Resolution.UNDECIDABLE  # 1 vote for 120, 2 absent
    assert decision.actions[D] == CatchUp(C, 111, 120)
    assert decision.actions[E] == CatchUp(C, 101, 120)
    assert two_phases(*args, [False, False, True, True, True]) == 120


@pytest.mark.parametrize("third_max", [115, 130])
def test_storage_session_lower_than_metadata_truncates_to_its_low_water_mark(third_max: int) -> None:
    args = ([998] * 3 + [997] * 2, [U] * 3 + [100] * 2, [998, 998, 997, 997, 997], [110, 110, 100, 100, 100],
            [125, 120, third_max, 115, 115])  # fmt: skip
    driver, _, _ = build(*args, ALL5)
    driver.connect(C)
    assert driver.manager.decide().actions[C] == Truncate(100)  # its own low-water mark; it proposes nothing
    two_phases(*args, ALL5)


@pytest.mark.parametrize(
    "availability",
    [[True, True, False, True, True], [True, True, False, False, True]],
)
def test_replicas_unavailable(availability: list[bool | None]) -> None:
    two_phases([998] * 3 + [997] * 2, [U] * 3 + [100] * 2, [998] * 3 + [997] * 2, [110] * 3 + [100] * 2,
               [120] * 3 + [115] * 2, availability)  # fmt: skip


@pytest.mark.parametrize(
    ("max_ids", "availability"),
    [
        ([120, 120, 115, 115, 110], [False, True, True, True, False]),
        ([120, 120, 120, 115, 115], [False, False, True, True, True]),
    ],
)
def test_voters_unavailable(max_ids: list[int], availability: list[bool | None]) -> None:
    two_phases([998] * 5, [U] * 5, [998] * 5, [110] * 5, max_ids, availability)


@pytest.mark.parametrize(
    ("storage_sessions", "availability"),
    [
        ([998, 998, 997, 997], [True] * 4),  # one added
        ([998, 998, 997, 997, 997], [True] * 5),  # two added
        ([998, 998, 997, 997], [False, True, True, True]),  # one added while another is down
    ],
)
def test_replicas_added(storage_sessions: list[int], availability: list[bool | None]) -> None:
    n = len(storage_sessions)
    two_phases([998, 998, 997], [U, U, 100], storage_sessions, [110, 110] + [100] * (n - 2),
               [120, 120] + [115] * (n - 2), availability)  # fmt: skip


def test_replica_removed() -> None:
    two_phases([998, 998, 997], [U, U, 100], [998, 998, 997], [110, 110, 100], [120, 120, 115],
               [None, True, True])  # fmt: skip


def test_two_replicas_removed() -> None:
    two_phases([998] * 3 + [997] * 2, [U] * 3 + [100] * 2, [998] * 3 + [997] * 2, [110] * 3 + [100] * 2,
               [120] * 3 + [115] * 2, [None, None, True, True, True])  # fmt: skip


def test_replica_replaced() -> None:
    two_phases([998, 998, 997], [U, U, U], [998, 998, 997, 997], [110, 110, 100, 100], [120, 120, 115, 115],
               [None, True, True, True])  # fmt: skip


def test_running_recovery_twice_changes_nothing() -> None:
    args = ([998] * 5, [U] * 5, [998] * 5, [110] * 5, [120, 120, 120, 115, 115])
    driver, assigned, _ = build(*args, [True, True, True, False, False])
    driver.connect(A, B, C)
    first = driver.run()
    driver.connect(D, E)
    first = driver.run()
    assert first.replica_states is not None
    logs = {r: list(s.log) for r, s in driver.storages.items()}

    again = Driver(RecoveryManager(SESSION + 1, first.replica_states, assigned), driver.storages)
    again.connect(*assigned)
    second = again.run()
    assert second.high_water_mark == first.high_water_mark
    assert {r: s.log for r, s in driver.storages.items()} == logs
    assert {type(action) for _, action in again.performed} == {SetLowWaterMark}
    assert second.replica_states == {r: ReplicaState(SESSION + 1, U) for r in assigned}


# The seed's example: A holds HA = 120, B is unreachable, C holds HC = 110; the quorum is two.
SEED_PREVIOUS = {r: ReplicaState(998, U) for r in (A, B, C)}


def facts(max_id: int, session_id: int = 998, low_water_mark: int = 100) -> ReplicaFacts:
    return ReplicaFacts(session_id, low_water_mark, -1, max_id)


def test_undecidable_until_the_offline_replica_returns() -> None:
    manager = RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C])
    manager.replica_online(A, facts(120))
    manager.replica_online(C, facts(110))
    decision = manager.decide()
    assert (decision.resolution, decision.high_water_mark) == (Resolution.UNDECIDABLE, None)
    assert decision.actions == {A: Wait(WaitReason.UNRESOLVED), B: Wait(WaitReason.OFFLINE), C: CatchUp(A, 111, 120)}
    assert not decision.complete and decision.replica_states is None

    manager.replica_online(B, facts(115))
    decision = manager.decide()
    assert (decision.resolution, decision.high_water_mark) == (Resolution.RESOLVED, 115)
    # A behind replica catches up before its low-water mark is set: storage refuses a mark above what it holds.
    assert decision.actions == {A: Truncate(115), B: SetLowWaterMark(115), C: CatchUp(A, 111, 115)}
    manager.replica_progress(C, 115)
    assert manager.decide().actions[C] == SetLowWaterMark(115)


def test_undecidable_until_the_behind_replica_catches_up() -> None:
    storages = {A: FakeStorage.with_records(998, 100, 120), B: FakeStorage.with_records(998, 100, 125),
                C: FakeStorage.with_records(998, 100, 110)}  # fmt: skip
    driver = Driver(RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C]), storages)
    driver.connect(A, C)
    assert driver.manager.decide().resolution is Resolution.UNDECIDABLE
    decision = driver.run()
    assert decision.high_water_mark == 120 and decision.recovered == {A, C}
    assert decision.replica_states == {A: ReplicaState(SESSION, U), B: ReplicaState(998, 120),
                                       C: ReplicaState(SESSION, U)}  # fmt: skip
    driver.connect(B)  # its uncommitted tail goes
    assert driver.manager.decide().actions[B] == Truncate(120)
    decision = driver.run()
    assert decision.recovered == {A, B, C} and storages[B].max_transaction_id == 120


def test_two_unavailable_wait_for_both() -> None:
    previous = {r: ReplicaState(998, U) for r in (A, B, C, D, E)}
    manager = RecoveryManager(SESSION, previous, [A, B, C, D, E])
    for r, m in ((A, 125), (B, 120), (C, 115)):
        manager.replica_online(r, facts(m))
    assert manager.decide().resolution is Resolution.UNDECIDABLE  # 125: 1 vote + 2 absent
    manager.replica_online(D, facts(118))
    assert manager.decide().resolution is Resolution.UNDECIDABLE  # 120: 2 votes + 1 absent
    manager.replica_online(E, facts(110))
    assert manager.decide().high_water_mark == 118  # 118: A, B, D


def test_replica_going_offline_before_resolution_counts_as_absent() -> None:
    manager = RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C])
    manager.replica_online(A, facts(120))
    manager.replica_online(B, facts(110))
    manager.replica_offline(B)
    manager.replica_progress(B, 120)  # a stale report: ignored
    assert manager.decide().resolution is Resolution.UNDECIDABLE
    manager.replica_online(C, facts(110))
    manager.replica_online(B, facts(110))
    assert manager.high_water_mark == 110


def test_metadata_write_back() -> None:
    x, new = replica(8), replica(9)
    previous = {A: ReplicaState(998, U), B: ReplicaState(998, U), C: ReplicaState(998, U),
                D: ReplicaState(997, 100), x: ReplicaState(998, U)}  # fmt: skip
    manager = RecoveryManager(SESSION, previous, [A, B, C, D, new])  # x removed, new added
    for r in (A, B, C):
        manager.replica_online(r, facts(120))
    for r in (A, B, C):
        manager.low_water_mark_set(r)
    decision = manager.decide()
    assert decision.complete and decision.recovered == {A, B, C}
    assert decision.replica_states == {
        A: ReplicaState(SESSION, U), B: ReplicaState(SESSION, U), C: ReplicaState(SESSION, U),
        D: ReplicaState(997, 100),  # closing mark already set: unchanged
        new: ReplicaState(-1, 120),  # new and not recovered
    }  # fmt: skip


def test_no_write_back_before_a_quorum_recovered() -> None:
    manager = RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C])
    manager.replica_online(A, facts(120))
    manager.replica_online(B, facts(120))
    manager.low_water_mark_set(A)
    decision = manager.decide()
    assert decision.high_water_mark == 120 and not decision.complete and decision.replica_states is None


def test_decide_is_a_pure_read() -> None:
    manager = RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C])
    manager.replica_online(A, facts(120))
    manager.replica_online(C, facts(110))
    assert manager.decide() == manager.decide()


def test_errors() -> None:
    manager = RecoveryManager(SESSION, SEED_PREVIOUS, [A, B, C])
    with pytest.raises(SessionFencedError):
        manager.replica_online(A, facts(120, session_id=SESSION + 1))
    with pytest.raises(KeyError):
        manager.replica_online(D, facts(120))
    with pytest.raises(ValueError):
        manager.low_water_mark_set(A)
    with pytest.raises(ValueError):
        RecoveryManager(SESSION, SEED_PREVIOUS, [])


MARKS = st.integers(-1, 12)


@settings(max_examples=200)
@given(st.lists(st.tuples(MARKS, st.booleans(), st.booleans()), min_size=1, max_size=7))
def test_resolved_mark_is_held_by_a_majority_and_loses_no_majority_held_transaction(
    replicas: list[tuple[int, bool, bool]],
) -> None:
    """replicas: (high-water mark, reachable, proposes). A transaction a majority of the previous set holds may
    be committed: it must never be lost. The resolved mark itself must be held by a majority."""
    quorum = len(replicas) // 2 + 1
    present = [m for m, reachable, _ in replicas if reachable]
    proposals = [m for m, reachable, proposes in replicas if reachable and proposes]
    if not proposals:
        return
    resolution, resolved = resolve_high_water_mark(
        present, num_absent=len(replicas) - len(present), quorum=quorum, floor=min(proposals)
    )
    if resolution is Resolution.RESOLVED:
        assert resolved is not None
        assert sum(1 for m in present if m >= resolved) >= quorum
        for txn in range(-1, 13):
            if sum(1 for m, _, _ in replicas if m >= txn) >= quorum:
                assert resolved >= txn
    else:
        assert resolved is None
    if len(present) == len(replicas) and min(present) >= min(proposals):
        assert resolution is Resolution.RESOLVED


def test_a_closed_replica_whose_storage_recorded_a_later_session_keeps_its_low_water_mark() -> None:
    """Metadata says C closed at 100 in session 997, but a later session's recovery (998, never recorded in
    the metadata) set C's low-water mark to 120 after copying 101..120 there. Those are committed, and the
    storage node refuses to truncate below its low-water mark (issue 25): recovery must not ask it to."""
    args = ([998, 998, 997, 998, 998], [U, U, 100, U, U], [998, 998, 998, 998, 998], [110, 110, 120, 110, 110],
            [120, 120, 120, 120, 120])  # fmt: skip
    driver, _, _ = build(*args, ALL5)
    driver.connect(C)
    assert not isinstance(driver.manager.decide().actions[C], Truncate)
    two_phases(*args, ALL5, lo=120, hi=120)


def test_a_replica_assigned_again_keeps_what_it_knows_committed() -> None:
    """A running node unassigned (dropped from the metadata) and assigned again is new to the next session, but
    appends told it that its records up to 1203 are committed: recovery keeps them and copies from 1204. Before,
    it was truncated to its low-water mark (567), which the node refuses at every try: it never caught up."""
    storages = {r: FakeStorage.with_records(SESSION - 1, 1204, 1443) for r in (A, B, C)}
    storages[D] = FakeStorage.with_records(SESSION - 3, 567, 1203, told_committed=1203)
    previous = {r: ReplicaState(SESSION - 1, U) for r in (A, B, C)}
    driver = Driver(RecoveryManager(SESSION, previous, [A, B, C, D]), storages)
    driver.connect(A, B, C, D)
    assert driver.manager.decide().actions[D] == CatchUp(A, 1204, 1443)
    decision = driver.run()
    assert decision.recovered == {A, B, C, D} and storages[D].log == storages[A].log
