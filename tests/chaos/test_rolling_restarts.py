"""Rolling restarts under load, as Kubernetes does them: every process restarted one after another (the three
storage nodes, then the two servers, then ZooKeeper), each with SIGTERM (ManagedProcess.stop: a graceful exit,
SIGKILL only past its grace) or with kill -9, waiting between steps until the cluster is healthy again: every
partition healthy at the owner ZooKeeper names, with all three replicas back in its write set (a storage node
taken down before the last one caught up would leave some partition on a bare quorum, or below it).

Each step reports what it cost in acknowledged-append gaps: the time from the stop and from the process being
ready again to the next acknowledged append, and the longest stretch without one (tests/chaos/timing.py). The
history checker runs at the end.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chaos.cluster import PARTITIONS, assignment, healthy_owners, servers_by_id
from tests.chaos.test_faults import STEP, check_run, report
from tests.chaos.test_zookeeper_faults import on_own_zookeeper, writing_from
from tests.chaos.timed import timed_fault
from tests.chaos.timing import table
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

HEALTHY_TIMEOUT_S = 90.0


def replicas_in_write_set(metrics_port: int) -> dict[int, int]:
    """partition -> replicas in its write set, from a server's waltz_server_partition_replicas gauge."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == "waltz_server_partition_replicas":
            for sample in family.samples:
                if sample.labels.get("state") == "write_set" and sample.value == sample.value:  # not NaN
                    found[int(sample.labels["partition"])] = int(sample.value)
    return found


async def fully_healthy(cluster: LocalCluster, timeout: float = HEALTHY_TIMEOUT_S) -> None:
    """Healthy owners, and each owner has every replica of its partitions in the write set."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        await healthy_owners(cluster, max(1.0, deadline - time.monotonic()))
        owners = await asyncio.to_thread(assignment, cluster)
        servers = await servers_by_id(cluster)
        counts = {}
        for server_id, server in servers.items():
            held = await asyncio.to_thread(replicas_in_write_set, server.metrics_port)
            counts.update({p: n for p, n in held.items() if owners[p].server_id == server_id})
        if len(counts) == PARTITIONS and all(n == len(cluster.storage) for n in counts.values()):
            return
        last = counts
        await asyncio.sleep(0.2)
    raise AssertionError(f"replicas not all in the write sets within {timeout:g} s: {last}")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "kill -9"])
def test_a_rolling_restart_of_every_process_under_load(how: str, tmp_path: Path) -> None:
    # kill -9 of each kind of process is in tests/chaos/test_faults.py and the soak; a whole rolling kill -9 (about
    # a minute and a half) runs with WALTZ_SLOW=1, to keep the default suite inside its time
    if how == "kill -9" and os.environ.get("WALTZ_SLOW") != "1":
        pytest.skip("the rolling kill -9 runs with WALTZ_SLOW=1")
    async def scenario(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
        await fully_healthy(cluster)
        steps: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            *((p.name, p.stop if how == "SIGTERM" else p.kill, p.start) for p in [*cluster.storage, *cluster.servers]),
            ("zookeeper", zookeeper.stop if how == "SIGTERM" else zookeeper.kill, zookeeper.start),
        ]
        recoveries = []
        async with writing_from(cluster, clients=2, submitters=2, limit=10**9) as load:  # bounded by the steps
            await load.acknowledged_at_least(STEP, "before the restarts")
            for name, stop, start in steps:
                began = time.monotonic()
                found, _ = await timed_fault(
                    load,
                    f"{how} {name}",
                    stop,
                    start,
                    0.0,
                    STEP,
                    settle=partial(fully_healthy, cluster),
                    partitions=PARTITIONS,
                )
                recoveries.append(found)
                report(
                    f"rolling {how}",
                    f"{name} down {found.healed_at - found.fault_at:.1f} s (stop and start), healthy again "
                    f"{time.monotonic() - began:.1f} s after the stop: {found.describe()}",
                )
        print("\n".join(table(recoveries)))
        await check_run(cluster, load.writers, f"rolling {how}")

    on_own_zookeeper(tmp_path, scenario, deadline=400)
