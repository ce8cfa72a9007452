"""`waltz server partitions` while a registered server is dead (killed with SIGKILL, its registration in ZooKeeper
alive until its session expires): the live servers' partitions are reported, the dead one is marked, and the exit
code says that one did not answer. It used to fail outright with the dead server's error."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WALTZ = Path(sys.executable).parent / "waltz"


def waltz(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WALTZ), *argv], capture_output=True, text=True, timeout=120, check=False)


def test_partitions_answers_for_the_live_servers_and_marks_a_killed_one(make_cluster: Any) -> None:
    # a long session: the killed server stays registered for the whole test
    cluster = make_cluster(storage_nodes=1, servers=2, partitions=4,
                           server_overrides={"zookeeper.sessionTimeoutSeconds": 60})
    zookeeper = ["--zookeeper", cluster.zookeeper, "--root", cluster.paths.root]
    deadline = time.monotonic() + 90
    while True:  # until both servers own partitions
        listed = waltz(*zookeeper, "server", "list", "--json")
        owners = {s["address"]: s["partitions"] for s in json.loads(listed.stdout or "[]")}
        if (len(owners) == 2 and all(owners.values())) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(owners) == 2 and all(owners.values()), listed.stdout + listed.stderr

    dead, live = cluster.servers[1], cluster.servers[0]
    dead.kill(signal.SIGKILL)
    answered = waltz(*zookeeper, "server", "partitions", "--json")
    still_registered = {s["address"] for s in json.loads(waltz(*zookeeper, "server", "list", "--json").stdout)}
    assert dead.address in still_registered  # the case this test is about: registered, yet dead

    assert answered.returncode == 1, answered.stdout + answered.stderr
    by_address = {d["address"]: d for d in json.loads(answered.stdout)}
    assert set(by_address) == {dead.address, live.address}
    assert by_address[live.address]["error"] == "" and by_address[live.address]["partitions"]
    assert by_address[dead.address]["error"] and by_address[dead.address]["partitions"] == []
    assert by_address[dead.address]["server_id"] is not None  # named from its registration

    text = waltz(*zookeeper, "server", "partitions")
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    assert [line for line in lines if dead.address in line and "UNREACHABLE" in line], text.stdout
    assert [line for line in lines if live.address in line and "UNREACHABLE" not in line], text.stdout
