"""Fixtures of the CLI integration tests: local clusters on the shared test ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from waltz_common.testing.local_cluster import LocalCluster


@pytest.fixture
def make_cluster(zookeeper, cluster_root, tmp_path) -> Iterator[Callable[..., LocalCluster]]:
    """make_cluster(storage_nodes=, servers=, partitions=, ...) starts a LocalCluster; all are stopped at the end."""
    clusters: list[LocalCluster] = []

    def make(**kwargs: Any) -> LocalCluster:
        n = len(clusters)
        cluster = LocalCluster(
            tmp_path / f"cluster{n}", zookeeper=zookeeper.connect_string, cluster_root=f"{cluster_root}/{n}", **kwargs
        )
        clusters.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()
