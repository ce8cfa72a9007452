"""ClusterInfo: the GetClusterInfo answer from the ownership a server last saw."""

from __future__ import annotations

from waltz.v1 import server_pb2
from waltz_common.topology import Ownership
from waltz_server.discovery import ClusterInfo


def test_every_partition_is_listed_in_order_with_its_owner_or_none():
    limits = server_pb2.Limits(max_message_bytes=16 << 20, max_transaction_bytes=1 << 20, max_batch_appends=2000)
    info = ClusterInfo("prod", 3, limits)
    topology = {2: Ownership("h2:7", 4), 0: Ownership("h0:7", 1), 1: Ownership(None, 3)}
    answer = info.response(topology, server_id=5)
    assert [(p.partition_id, p.address, p.generation) for p in answer.partitions] == [
        (0, "h0:7", 1), (1, "", 3), (2, "h2:7", 4)
    ]
    assert answer.cluster_name == "prod" and answer.num_partitions == 3 and answer.server_id == 5
    assert answer.limits == limits
    assert [p.address for p in info.response({}, 5).partitions] == ["", "", ""]  # not assigned yet
