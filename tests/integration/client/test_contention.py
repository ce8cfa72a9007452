"""Contention at realistic load (issue 31): three application processes of 20 reservers each on a few hot items,
each execute() reading the instance's own SQLite database (bench/contention_instance.py), against a real cluster.

Before issue 31 one instance made almost every reservation: 20/20/1,271 commits in 20 s, the two others' callback
threads blocked fetching data one feed message at a time while their lock failures waited behind the feed.
Asserted here: what a user cares about, not times: no reservation acted on a stale read, the databases are
identical, nothing was lost, and every instance makes progress (at least an eighth of the commits over the run;
a third is fair; the issue's 20% in every 10 s window is bench.contention's figure, not an assertion). With the
default 20 in flight per partition, before small transactions' data came inline in the feed, a quiet machine gave
the worst instance 11-27% (3 runs), two suites at once 4.2% in 1 run (the test asked a thirtieth); with inline
data, 3 runs at load average 10 gave it 27%, 29% and 30% (242/183/183, 176/272/209, 208/230/244).
The default run is 10 s of load (about 45 s with the cluster); WALTZ_SLOW=1 runs 60 s.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.contention import identical, run_instances
from waltz_common.testing.local_cluster import LocalCluster

SECONDS = 60.0 if os.environ.get("WALTZ_SLOW") == "1" else 10.0
INSTANCES = 3
SUBMITTERS = 20
ITEMS = 4
CLIENT = {"client.mountTimeout": 60.0, "client.requestTimeout": 60.0, "client.maxRetries": -1}


def test_every_instance_makes_progress_on_hot_locks_and_the_databases_agree(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", cluster_root="/test/contention") as cluster:
        results = run_instances(tmp_path / "run", cluster.client_config(**CLIENT), [], INSTANCES, SUBMITTERS, ITEMS,
                                SECONDS)
    commits = [len(r["commits"]) for r in results]
    assert [r["stale"] for r in results] == [0] * INSTANCES  # no reservation acted on a stale read: no oversell
    assert [r["error_count"] for r in results] == [0] * INSTANCES, [r["errors"] for r in results]
    assert identical([r["rows"] for r in results])  # same reservations, ids dense, in every database
    assert all(r["applied"] == r["final"] for r in results)  # each applied the whole log
    total = sum(commits)
    assert total > 0 and all(c >= total / 8 for c in commits), commits  # issue 31: 20/20/1,271
