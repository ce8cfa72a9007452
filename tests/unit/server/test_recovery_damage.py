"""RecoveryManager with damaged records (issue 33): a record that fails its checks inside what a replica
acknowledged still counts as held in the vote, is repaired from an intact copy, and bounds a catch-up from it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.server.recovery_harness import SESSION, A, B, C, Driver, FakeStorage, U
from waltz_server.recovery import (
    CatchUp,
    RecoveryManager,
    Repair,
    ReplicaState,
    Resolution,
    Truncate,
    Wait,
    WaitReason,
)

N = 899  # 900 committed transactions, 0..899


def damaged_driver(*replicas: tuple[str, int, set[int]]) -> Driver:
    """Three replicas of session 998 (none closed), each (name, max id, damaged ids)."""
    storages = {r: FakeStorage.with_records(998, 0, m) for r, m, _ in replicas}
    for r, _, damaged in replicas:
        storages[r].damaged = set(damaged)
    previous = {r: ReplicaState(998, U) for r in (A, B, C)}
    return Driver(RecoveryManager(SESSION, previous, [A, B, C]), storages)


def assert_all_repaired(driver: Driver, replicas: tuple[str, ...], hwm: int = N) -> None:
    decision = driver.run()
    assert decision.high_water_mark == hwm and decision.complete
    assert decision.recovered == set(replicas)
    for r in replicas:
        assert driver.storages[r].log == [f"t{i}" for i in range(hwm + 1)] and not driver.storages[r].damaged, r


def test_two_replicas_damaged_at_different_records_keep_every_transaction() -> None:
    """The issue's scenario: damage at 100 on B and at 500 on C never lowers the vote; each is repaired from a
    replica holding it intact."""
    driver = damaged_driver((A, N, set()), (B, N, {100}), (C, N, {500}))
    driver.connect(A, B, C)
    assert driver.manager.decide().high_water_mark == N
    assert_all_repaired(driver, (A, B, C))
    assert (B, Repair(A, (100,))) in driver.performed and (C, Repair(A, (500,))) in driver.performed


def test_two_damaged_replicas_repair_each_other_while_the_intact_one_is_away() -> None:
    driver = damaged_driver((A, N, set()), (B, N, {100}), (C, N, {500}))
    driver.connect(B, C)
    assert_all_repaired(driver, (B, C))
    assert (B, Repair(C, (100,))) in driver.performed and (C, Repair(B, (500,))) in driver.performed


def test_one_damaged_and_one_lagging_replica_keep_every_transaction() -> None:
    driver = damaged_driver((A, N, set()), (B, N, {100}), (C, 499, set()))
    driver.connect(A, B, C)
    assert_all_repaired(driver, (A, B, C))


def test_with_the_intact_replica_away_the_lagging_one_catches_up_from_the_damaged_one_past_its_damage() -> None:
    """B (damaged at 100) and C (lagging at 499) without A: undecidable until C caught up 500..899 from B, then
    899 with B and C, and B's 100 repaired from C."""
    driver = damaged_driver((A, N, set()), (B, N, {100}), (C, 499, set()))
    driver.connect(B, C)
    assert driver.manager.decide().resolution is Resolution.UNDECIDABLE
    assert_all_repaired(driver, (B, C))


def test_a_catch_up_stops_before_the_sources_damage() -> None:
    driver = damaged_driver((A, N, set()), (B, N, {700}), (C, 499, set()))
    driver.connect(B, C)
    assert driver.manager.decide().actions[C] == CatchUp(B, 500, 699)


def test_damage_with_no_intact_copy_reachable_waits_and_says_so() -> None:
    """100 is damaged on B and C and A is away: recovery resolves (B and C wrote 0..899) but never calls the two
    replicas recovered or opens the session until A brings an intact copy."""
    driver = damaged_driver((A, N, set()), (B, N, {100}), (C, N, {100}))
    driver.connect(B, C)
    decision = driver.run()
    assert decision.high_water_mark == N and not decision.complete
    assert decision.actions[B] == decision.actions[C] == Wait(WaitReason.NO_INTACT_COPY)
    driver.connect(A)
    assert_all_repaired(driver, (A, B, C))


def test_damage_above_the_resolved_mark_goes_with_the_truncation() -> None:
    driver = damaged_driver((A, 500, set()), (B, 510, {505}), (C, 500, set()))
    driver.connect(A, B, C)
    assert driver.manager.decide().actions[B] == Truncate(500)
    assert_all_repaired(driver, (A, B, C), hwm=500)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.sets(st.integers(0, 12), max_size=3), st.booleans()), min_size=3, max_size=3
    )
)
def test_damage_never_loses_a_transaction_a_majority_wrote(replicas: list[tuple[int, set[int], bool]]) -> None:
    """(max id, damaged ids, reachable) for three replicas: whatever the damage, a transaction that a majority
    wrote is never truncated, and a recovered replica holds every transaction up to the mark intact."""
    names = (A, B, C)
    driver = damaged_driver(*((n, m, {t for t in d if t <= m}) for n, (m, d, _) in zip(names, replicas, strict=True)))
    driver.connect(*(n for n, (_, _, up) in zip(names, replicas, strict=True) if up))
    decision = driver.run()
    if decision.high_water_mark is None:
        return
    for txn in range(13):
        if sum(1 for m, _, _ in replicas if m >= txn) >= 2:
            assert decision.high_water_mark >= txn
    for r in decision.recovered:
        assert driver.storages[r].max_transaction_id == decision.high_water_mark and not driver.storages[r].damaged
