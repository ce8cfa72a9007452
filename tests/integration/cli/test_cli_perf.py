"""`waltz perf produce` and `waltz perf consume` against a running LocalCluster, as the installed command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from waltz_common.testing.local_cluster import LocalCluster

WALTZ = Path(sys.executable).parent / "waltz"
FIELDS = {"operation", "transactions", "seconds", "per_second", "p50_ms", "p99_ms", "p999_ms", "errors", "settings",
          "lock_failures", "error_kinds"}


def perf(cluster: LocalCluster, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(WALTZ), "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "perf", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, (out, err)
    return out, err


def check_summary(data: dict[str, Any], operation: str) -> None:
    assert set(data) == FIELDS and data["operation"] == operation
    assert data["transactions"] > 0 and data["errors"] == 0 and data["per_second"] > 0
    assert 0 < data["p50_ms"] <= data["p99_ms"] <= data["p999_ms"]


@pytest.mark.slow
def test_produce_and_consume_print_their_tables_and_json(make_cluster: Any) -> None:
    cluster = make_cluster(storage_nodes=3, servers=1, partitions=2)
    live = perf(cluster, "consume", "--duration", "8", "--json")  # from now on, while the producers run
    closed = perf(cluster, "produce", "--duration", "2", "--writers", "8", "--payload", "100", "--json", "--progress")
    out, err = finish(closed)
    produced = json.loads(out)
    check_summary(produced, "produce")
    assert produced["settings"]["writers"] == 8 and produced["settings"]["partitions"] == [0, 1]
    assert "produce" in err and "txn" in err  # the progress line, asked for with --progress
    out, err = finish(perf(cluster, "produce", "-d", "2", "--rate", "200", "--locks", "--lock-keys", "3",
                           "-p", "1"))
    assert err == ""  # no progress line: stderr is not a terminal
    header, rule, row, describe = out.splitlines()[:4]
    assert header.split()[:4] == ["operation", "transactions", "seconds", "per"] and set(rule) <= {"-", " "}
    cells = row.split()
    # 200/s for 2 s, and retries: never above; below on a busy machine (176 at a load average of 9), but a
    # tenth of it is a limiter's mistake, not load
    assert cells[0] == "produce" and 40 <= int(cells[1].replace(",", "")) <= 450
    assert int(cells[7]) == 0  # errors
    assert "open loop at 200/s" in describe and "locks on" in describe
    consumed = json.loads(finish(live)[0])
    check_summary(consumed, "consume")
    total = produced["transactions"] + int(cells[1].replace(",", ""))
    # those committed before it had started and read where to begin (a loaded machine) are not its to count
    assert consumed["transactions"] <= total
    replay = json.loads(finish(perf(cluster, "consume", "--from-start", "--count", str(total), "--fetch-data",
                                    "-d", "60", "--json"))[0])
    assert replay["transactions"] == total and replay["errors"] == 0 and replay["settings"]["fetch_data"]


def test_a_count_that_never_arrives_is_an_error(make_cluster: Any) -> None:
    cluster = make_cluster(storage_nodes=1, servers=1, partitions=1)
    process = perf(cluster, "consume", "--count", "5", "-d", "1")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1 and "only 0 of 5 transactions arrived in 1 s" in err


def test_a_replay_counts_from_the_mount(make_cluster: Any) -> None:
    """The catch-up feed of a replay comes with the mount: it is counted, and timed, from the mount on."""
    cluster = make_cluster(storage_nodes=1, servers=1, partitions=1)
    finish(perf(cluster, "produce", "-d", "1", "--writers", "20", "--json"))
    time.sleep(2)  # well before the consumer starts (it takes up to a second of clock difference as live)
    out, _ = finish(perf(cluster, "consume", "--from-start", "--count", "500", "--json"))
    replay = json.loads(out)
    assert replay["transactions"] == 500 and 0 < replay["seconds"] < 10 and replay["per_second"] > 50
    assert replay["p50_ms"] is None  # history: no latency for transactions sent before the consumer started
