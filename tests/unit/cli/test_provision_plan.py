"""The provisioning planner: what `waltz cluster provision` changes, from ZooKeeper's state and a declaration."""

from __future__ import annotations

import pytest

from waltz_cli.errors import UsageError
from waltz_cli.provision import ClusterState, NodeSpec, parse_nodes, placement, plan

NODES = parse_nodes([f"s{i}.svc:55290:55291" for i in range(3)])


def test_parse_nodes_groups_by_position_and_refuses_bad_items():
    assert NODES[2] == NodeSpec("s2.svc:55290", 55291, 2)
    for bad in (["s0:55290"], ["s0.svc:55290:admin"], ["55291"], ["a:1:2", "a:1:3"]):
        with pytest.raises(UsageError):
            parse_nodes(bad)


def test_placement_spreads_replicas_evenly_and_never_twice_on_a_node():
    plan5 = placement(10, [f"n{i}" for i in range(5)], 3)
    assert sorted(len(p) for p in plan5.values()) == [6] * 5
    for pid in range(10):
        assert sum(pid in pids for pids in plan5.values()) == 3
    assert placement(4, ["a", "b", "c"], 3) == {n: [0, 1, 2, 3] for n in "abc"}


def test_first_install_creates_registers_and_assigns():
    changes = plan(ClusterState(None), 4, NODES, 3)
    assert changes.create
    assert changes.add_nodes == NODES
    assert changes.assign == {n.connect_string: [0, 1, 2, 3] for n in NODES}
    assert changes.idle_nodes == []


def test_rerun_on_a_provisioned_cluster_changes_nothing():
    state = ClusterState(
        4,
        {n.connect_string: (n.group, n.admin_port) for n in NODES},
        {n.connect_string: [0, 1, 2, 3] for n in NODES},
    )
    changes = plan(state, 4, NODES, 3)
    assert (changes.create, changes.add_nodes, changes.assign, changes.idle_nodes) == (False, [], {}, [])


def test_scale_out_registers_new_nodes_keeps_assignments_and_names_idle_nodes():
    state = ClusterState(
        4,
        {n.connect_string: (n.group, n.admin_port) for n in NODES},
        {n.connect_string: [0, 1, 2, 3] for n in NODES},
    )
    five = parse_nodes([f"s{i}.svc:55290:55291" for i in range(5)])
    changes = plan(state, 4, five, 3)
    assert changes.add_nodes == five[3:]
    assert changes.assign == {}
    assert changes.idle_nodes == ["s3.svc:55290", "s4.svc:55290"]


def test_contradictions_are_refused_all_at_once():
    state = ClusterState(8, {"s0.svc:55290": (0, 9999)}, {})
    with pytest.raises(UsageError, match=r"8 partitions, not 4.*admin port 9999, not 55291"):
        plan(state, 4, NODES, 3)
    with pytest.raises(UsageError, match="between 1 and the number of storage nodes"):
        plan(ClusterState(None), 4, NODES, 4)
