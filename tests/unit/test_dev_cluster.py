"""The decisions of `waltz dev` on a data directory: the shape to run, which ports to keep."""

from __future__ import annotations

import pytest

from waltz_common.testing.dev_cluster import DevClusterError, DevState, choose_ports, plan

NONE: dict[str, None] = {"partitions": None, "storage_nodes": None, "servers": None, "cluster_root": None}


def test_a_new_directory_gets_the_defaults_or_the_options():
    assert plan(None, **NONE) == DevState("/waltz/dev", partitions=2, storage_nodes=3, servers=1)
    assert plan(None, partitions=4, storage_nodes=1, servers=2, cluster_root="/w") == DevState("/w", 4, 1, 2)


def test_kept_data_keeps_its_shape_and_ports_and_only_the_servers_may_change():
    saved = DevState("/w", 4, 3, 1, zookeeper_port=2181, ports={"storage-0": [1, 2, 3]})
    assert plan(saved, **NONE) == saved
    assert plan(saved, **{**NONE, "servers": 2, "partitions": 4}).servers == 2
    for option, value in (("partitions", 8), ("storage_nodes", 1), ("cluster_root", "/other")):
        with pytest.raises(DevClusterError, match="kept data holds a cluster with"):
            plan(saved, **{**NONE, option: value})


def test_saved_ports_are_kept_when_free_and_storage_ports_must_be():
    assert choose_ports("server-0", 2, [10, 11], {10, 11}, must_keep=False) == [10, 11]
    assert choose_ports("server-0", 2, [10, 11], {10}, must_keep=False) is None  # new ones
    assert choose_ports("server-0", 2, None, set(), must_keep=False) is None
    with pytest.raises(DevClusterError, match=r"storage-1 must listen on its port\(s\) \[11\] again"):
        choose_ports("storage-1", 3, [10, 11, 12], {10, 12}, must_keep=True)


def test_the_state_file_round_trips_and_a_foreign_file_is_refused():
    state = DevState("/w", 2, 3, 1, zookeeper_port=5, ports={"server-0": [7, 8]})
    assert DevState.from_json(state.to_json(), "f") == state
    for text in ("{}", "not json", '{"version": 1, "surprise": 1}'):
        with pytest.raises(DevClusterError, match="not a waltz dev state file"):
            DevState.from_json(text, "f")
