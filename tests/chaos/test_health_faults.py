"""Health under a disk fault: a storage node whose writes fail (RLIMIT_FSIZE lowered from outside, as in
test_faults) turns NOT_SERVING and names the failing partitions and the error, while the cluster goes on with
the other two replicas; once its writes work again and it has caught up it is SERVING again, and the history
check finds nothing lost or doubled."""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path

from tests.chaos.cluster import PARTITIONS, healthy_owners, writing
from tests.chaos.test_faults import STEP, check_run, on_cluster, report
from tests.integration.health_probe import status, wait_for
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_storage.admin_client import StorageAdminClient
from waltz_storage.health import partition_name


def write_failures(cluster: LocalCluster, index: int) -> dict[int, str]:
    """partition -> its failing write's error, as storage node index reports it on its admin port."""
    node = cluster.storage[index]
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, PARTITIONS) as admin:
        return {p.partition_id: p.write_failure for p in admin.list_partitions() if p.write_failure}


def test_a_storage_node_whose_writes_fail_is_not_serving_until_they_work_again(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        victim = cluster.storage[2]
        address = f"127.0.0.1:{victim.port}"
        assert victim.process is not None
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the write errors")
            assert status(address) == "SERVING"
            pid = victim.process.pid
            smallest = min(f.stat().st_size for f in victim.directory.glob("*/*.seg"))
            hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (smallest, hard))
            try:
                took = await asyncio.to_thread(wait_for, address, "", "NOT_SERVING", 60)
                failing = await asyncio.to_thread(write_failures, cluster, 2)
                assert failing and all("File too large" in error for error in failing.values()), failing
                for partition in failing:
                    assert status(address, partition_name(partition)) == "NOT_SERVING", partition
                acked = await writer.acknowledged_at_least(acked + STEP, "with one node's writes failing")
                for node in cluster.storage[:2]:
                    assert status(f"127.0.0.1:{node.port}") == "SERVING", node.name
                # The servers' retries (recovery truncates, low-water marks) succeed on the full disk: still failing.
                assert status(address) == "NOT_SERVING"
                assert set(await asyncio.to_thread(write_failures, cluster, 2)) >= set(failing)
            finally:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
            mended = time.monotonic()
            back = await asyncio.to_thread(wait_for, address, "", "SERVING", 90)
            assert await asyncio.to_thread(write_failures, cluster, 2) == {}
            acked = await writer.acknowledged_at_least(acked + STEP, "after the node's writes work again")
        report(
            "health: write errors",
            f"NOT_SERVING {took:.1f} s after the limit (failing partitions {sorted(failing)}), SERVING again "
            f"{back:.1f} s after it was lifted ({time.monotonic() - mended:.1f} s to the next check); {acked} acked",
        )
        await check_run(cluster, writer, "health: write errors")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)
