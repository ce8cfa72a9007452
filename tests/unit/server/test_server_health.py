"""The server's health names from its ZooKeeper connection and owned partitions (waltz_server.health)."""

from __future__ import annotations

from waltz_common.health import Verdict
from waltz_server.health import LIVE, PARTITIONS, SERVICE, PartitionHealth, partition_name, server_verdicts


def test_connected_with_every_partition_committing_is_serving_everywhere():
    verdicts = server_verdicts(True, [PartitionHealth(0, True, ""), PartitionHealth(3, True, "")])
    assert set(verdicts) == {"", SERVICE, LIVE, PARTITIONS, partition_name(0), partition_name(3)}
    assert all(v == Verdict(True) for v in verdicts.values())
    assert partition_name(3) == "waltz.v1.WaltzServer/partition/3"


def test_a_partition_that_cannot_commit_says_why_and_readiness_stays():
    verdicts = server_verdicts(
        True, [PartitionHealth(0, True, ""), PartitionHealth(1, False, "no quorum: 1 of 3 replicas connected")]
    )
    assert verdicts[""] == verdicts[SERVICE] == Verdict(True)
    assert verdicts[partition_name(0)] == Verdict(True)
    assert verdicts[partition_name(1)] == Verdict(False, "no quorum: 1 of 3 replicas connected")
    assert verdicts[PARTITIONS] == Verdict(False, "partition 1: no quorum: 1 of 3 replicas connected")
    assert verdicts[LIVE] == Verdict(True)


def test_an_unhealthy_partition_without_detail_still_gets_a_reason():
    verdicts = server_verdicts(True, [PartitionHealth(2, False, "")])
    assert not verdicts[partition_name(2)].serving and verdicts[partition_name(2)].reason


def test_before_joining_the_cluster_nothing_is_ready_but_the_process_is_live():
    verdicts = server_verdicts(False, [])
    for name in ("", SERVICE):
        assert not verdicts[name].serving and "ZooKeeper" in verdicts[name].reason, name
    assert verdicts[LIVE] == Verdict(True)


def test_the_partitions_health_does_not_depend_on_zookeeper():
    """Owned partitions commit through a ZooKeeper outage (their store sessions fence them, not ZooKeeper):
    their names say whether they can commit, whatever the connection (issue 32)."""
    verdicts = server_verdicts(True, [PartitionHealth(0, True, ""), PartitionHealth(1, False, "fenced")])
    assert verdicts[partition_name(0)] == Verdict(True)
    assert verdicts[partition_name(1)] == Verdict(False, "fenced")


def test_owning_nothing_is_all_partitions_healthy():
    verdicts = server_verdicts(True, [])
    assert verdicts[PARTITIONS] == Verdict(True)


def test_the_identity_name_serves_once_the_server_id_is_taken():
    from waltz_server.health import identity_name

    assert identity_name(7) not in server_verdicts(True, [])
    verdicts = server_verdicts(True, [], server_id=7)
    assert verdicts[identity_name(7)] == Verdict(True)
    assert identity_name(7) == "waltz.v1.WaltzServer/server/7"
