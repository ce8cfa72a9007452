"""Discovery from server addresses: client.servers parsing, the order servers are asked in, topology."""

from __future__ import annotations

import pytest

from waltz.v1 import server_pb2
from waltz_client.config import ClientConfig
from waltz_client.driver import Ownership
from waltz_client.servers_driver import addresses_to_try, freshest, topology_of
from waltz_common.config import ConfigError


def test_client_servers_replace_the_zookeeper_keys():
    config = ClientConfig.of({"client.servers": "a:1, b:2"})
    assert config.servers == ("a:1", "b:2") and config.zookeeper_connect_string == ""
    assert ClientConfig.of({"client": {"servers": ["a:1"]}}).servers == ("a:1",)
    wanted = r"set client\.servers \(or WALTZ_CLIENT_SERVERS\), or zookeeper\.connectString and cluster\.root"
    with pytest.raises(ConfigError, match=wanted):
        ClientConfig.of({})
    with pytest.raises(ConfigError, match="'a' is not host:port"):
        ClientConfig.of({"client.servers": "a"})
    zk = ClientConfig.of({"zookeeper.connectString": "z:2181", "cluster.root": "/w"})
    assert zk.servers == () and zk.zookeeper_connect_string == "z:2181"


def test_the_server_that_answered_last_is_asked_first_then_seeds_then_learned_owners():
    topology = {0: Ownership("c:3", 1), 1: Ownership(None, 1), 2: Ownership("a:1", 2)}
    assert addresses_to_try(("a:1", "b:2"), topology, None) == ["a:1", "b:2", "c:3"]
    assert addresses_to_try(("a:1", "b:2"), topology, "c:3") == ["c:3", "a:1", "b:2"]


def test_topology_from_cluster_info():
    info = server_pb2.ClusterInfoResponse(partitions=[
        server_pb2.PartitionOwner(partition_id=0, address="h:1", generation=2),
        server_pb2.PartitionOwner(partition_id=1, address="", generation=3),
    ])
    assert topology_of(info) == {0: Ownership("h:1", 2), 1: Ownership(None, 3)}


def test_a_poll_keeps_the_highest_generation_of_each_partition():
    current = {0: Ownership("a:1", 2), 1: Ownership("a:1", 1), 2: Ownership("b:2", 1)}
    woken_old_owner = {0: Ownership("a:1", 2), 1: Ownership("a:1", 1), 2: Ownership("b:2", 1)}
    coordinator = {0: Ownership("b:2", 3), 1: Ownership(None, 1), 2: Ownership("b:2", 1)}
    merged = freshest(current, [woken_old_owner, coordinator])
    assert merged == {0: Ownership("b:2", 3), 1: Ownership("a:1", 1), 2: Ownership("b:2", 1)}
    # an answer behind what the client knows cannot take a partition back; a newer one moves it
    assert freshest(merged, [woken_old_owner]) == merged
    assert freshest({}, [{0: Ownership(None, 0)}]) == {0: Ownership(None, 0)}
