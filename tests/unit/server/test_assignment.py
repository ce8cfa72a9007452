"""assign_partitions: initial assignment, joins, leaves, preferences, and invariants over random clusters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_server.assignment import PartitionInfo, assign_partitions


def infos(*pairs: tuple[int, int]) -> list[PartitionInfo]:
    return [PartitionInfo(p, g) for p, g in pairs]


def owners(assignment: dict[int, list[PartitionInfo]]) -> dict[int, tuple[int, int]]:
    """partition -> (server, generation); fails if a partition is assigned twice."""
    found: dict[int, tuple[int, int]] = {}
    for server, parts in assignment.items():
        for info in parts:
            assert info.partition_id not in found
            found[info.partition_id] = (server, info.generation)
    return found


INITIAL = assign_partitions([1, 2, 3], {}, 10)


def test_initial_assignment() -> None:
    assert {
        1: infos((0, 1), (1, 1), (2, 1), (3, 1)),
        2: infos((4, 1), (5, 1), (6, 1)),
        3: infos((7, 1), (8, 1), (9, 1)),
    } == INITIAL


def test_a_server_joins() -> None:
    new = assign_partitions([1, 2, 3, 4], INITIAL, 10)
    assert [len(new[s]) for s in (1, 2, 3, 4)] == [3, 3, 2, 2]
    before, after = owners(INITIAL), owners(new)
    moved = {p for p in after if after[p][0] != before[p][0]}
    assert moved == {3, 9} and [i.partition_id for i in new[4]] == [3, 9]
    for p, (_, gen) in after.items():
        assert gen == before[p][1] + (1 if p in moved else 0)


def test_a_server_leaves() -> None:
    new = assign_partitions([1, 3], INITIAL, 10)
    before, after = owners(INITIAL), owners(new)
    assert sorted(after) == list(range(10)) and {len(v) for v in new.values()} == {5}
    for p, (server, gen) in after.items():
        if before[p][0] == 2:
            assert server in (1, 3) and gen == 2  # moved: a new generation
        else:
            assert (server, gen) == before[p]  # kept: same server, same generation


def test_the_last_server_leaves() -> None:
    assert assign_partitions([], INITIAL, 10) == {}


def test_preferred_partitions_are_honoured() -> None:
    new = assign_partitions([1, 2, 3], INITIAL, 10, preferred={3: [0, 1]})
    after = owners(new)
    assert after[0] == (3, 2) and after[1] == (3, 2)
    assert {len(v) for v in new.values()} == {3, 4}


def test_preferences_beyond_capacity_or_range_and_contention() -> None:
    # Server 1 takes 3 and 2 and is then full; 3 is gone when server 2 asks; 99 does not exist.
    new = assign_partitions([1, 2], {}, 4, preferred={1: [3, 2, 1, 99], 2: [3, 0]})
    assert new == {1: infos((2, 1), (3, 1)), 2: infos((0, 1), (1, 1))}


def test_new_partitions_get_generation_one() -> None:
    new = assign_partitions([1, 2, 3], INITIAL, 12)
    after = owners(new)
    assert after[10] == (2, 1) and after[11] == (3, 1)
    assert all(after[p] == owners(INITIAL)[p] for p in range(10))


def test_decreasing_the_number_of_partitions_is_refused() -> None:
    with pytest.raises(ValueError):
        assign_partitions([1, 2, 3], INITIAL, 9)


def test_a_partition_held_twice_moves_to_a_newer_generation() -> None:
    new = assign_partitions([1, 2], {1: infos((0, 4)), 2: infos((0, 6), (1, 1))}, 2)
    assert owners(new)[0][1] == 7


SERVER_IDS = st.integers(0, 9)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[int], dict[int, list[PartitionInfo]], int, dict[int, list[int]]]:
    num_partitions = draw(st.integers(0, 40))
    old = draw(st.integers(0, num_partitions))
    current: dict[int, list[PartitionInfo]] = {}
    for pid in range(old):
        server = draw(SERVER_IDS)
        current.setdefault(server, []).append(PartitionInfo(pid, draw(st.integers(0, 5))))
    live = draw(st.lists(SERVER_IDS, min_size=1, max_size=6, unique=True))
    preferred = draw(st.dictionaries(SERVER_IDS, st.lists(st.integers(0, num_partitions + 2), max_size=4)))
    return live, current, num_partitions, preferred


@settings(max_examples=200)
@given(clusters(), st.booleans())
def test_every_partition_has_exactly_one_live_owner(cluster, with_preferences: bool) -> None:
    live, current, num_partitions, preferred = cluster
    new = assign_partitions(live, current, num_partitions, preferred if with_preferences else None)
    after = owners(new)
    assert sorted(new) == sorted(live) and sorted(after) == list(range(num_partitions))
    base = num_partitions // len(live)
    assert all(base <= len(parts) <= base + 1 for parts in new.values())
    before = {i.partition_id: (s, i.generation) for s, parts in current.items() for i in parts}
    for pid, (server, gen) in after.items():
        old_server, old_gen = before.get(pid, (None, 0))
        assert gen == (old_gen if server == old_server else old_gen + 1)
    if not with_preferences:
        for server in live:  # a live server keeps what it held, up to its fair share
            held = sum(1 for s, _ in before.values() if s == server)
            kept = sum(1 for p, (s, _) in after.items() if s == server and before.get(p, (None,))[0] == server)
            assert kept >= min(held, base)
    # Stable: recomputing with nothing changed moves nothing.
    assert assign_partitions(live, new, num_partitions, preferred if with_preferences else None) == new
