"""Three client processes, each offered three times its share of the cluster's capacity (measured in the same test by a
closed loop): the submits queue first come, first served, the only errors are time-outs that name their setting,
and the committed rate holds (bench.overload's short form; its 60 s form is the benchmark)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from bench.overload import Load, capacity, max_overtaken, run_load
from waltz_common.testing.zookeeper import ZooKeeperProcess

local_cluster = pytest.importorskip("waltz_common.testing.local_cluster")

PROCESSES = 3
REQUEST_TIMEOUT_S = 1.0  # short: the later submits of a 5 s run time out
FACTOR = 3  # offered / the closed loop's rate (3: overloaded even when that rate was measured low on a busy machine)
SLOTS = 4  # client.maxConcurrentTransactions: a capacity the shared machine can offer twice of


def test_max_overtaken_counts_later_arrivals_that_left_first() -> None:
    assert max_overtaken([0, 1, 2, 3]) == 0
    assert max_overtaken([1, 2, 3, 0]) == 3  # 0 left after the three that arrived after it
    assert max_overtaken([0, 2, 1, 4, 3]) == 1


def test_a_client_offered_more_than_its_capacity_queues_fairly_and_keeps_committing(
        zookeeper: ZooKeeperProcess, tmp_path: Path) -> None:
    with local_cluster.LocalCluster(tmp_path / "cluster", zookeeper=zookeeper.connect_string,
                                    cluster_root=f"/test/{uuid.uuid4().hex[:12]}") as cluster:
        config = cluster.client_config(**{"client.requestTimeout": REQUEST_TIMEOUT_S,
                                          "client.maxConcurrentTransactions": SLOTS})
        closed = capacity(config, PROCESSES, 2.0)
        seconds = 5.0
        results = run_load(Load(PROCESSES, seconds, config, rate=FACTOR * closed / PROCESSES))
    committed = sum(r["committed"] for r in results) / seconds
    problems = []
    for i, r in enumerate(results):
        # first come, first served (time-outs too): a later arrival goes first only by finding a free slot with
        # nobody waiting
        if r["overtaken"] > 2 * SLOTS:
            problems.append(f"process {i}: a submit was overtaken by {r['overtaken']} later ones")
        # every submit ended: committed, or timed out by client.requestTimeout (nothing else failed)
        if r["errors"]:
            problems.append(f"process {i}: {r['errors']} errors other than documented time-outs: {r['error_samples']}")
    # the queue grows for 5 s: the oldest submits of the later seconds time out...
    if not sum(r["timeouts"] for r in results):
        problems.append("no submit timed out")
    # ...and the committed rate does not collapse (the herd this replaced committed under 1% of the closed loop's
    # rate here). A generous factor: on a shared 2-core machine the open loop's processes spend CPU offering and
    # timing out thousands of submits, and each hop of a round waits behind them in the event loop
    if committed < closed / 25:
        problems.append(f"{committed:,.0f} committed/s, the closed loop {closed:,.0f}/s")
    assert not problems, "; ".join(problems) + "".join(
        f"; process {i}: {r['committed'] / seconds:,.0f} committed/s, {r['timeouts']} time-outs, the offering "
        f"{r['behind']:.2f} s behind at most, {r['cpu'] / seconds:.2f} CPU s/s" for i, r in enumerate(results))
