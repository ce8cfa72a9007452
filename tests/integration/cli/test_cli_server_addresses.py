"""`waltz server ...` and `waltz perf ...` from --server-addresses alone (they list it in --help, and used to reject
it), and `waltz cluster verify` failing when a server of two is gone (it used to say PASSED)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WALTZ = Path(sys.executable).parent / "waltz"


def waltz(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WALTZ), *argv], capture_output=True, text=True, timeout=timeout, check=False)


def test_server_and_perf_commands_take_server_addresses_and_verify_names_a_missing_server(make_cluster: Any) -> None:
    cluster = make_cluster(storage_nodes=1, servers=2, partitions=2)
    first, second = (server.address for server in cluster.servers)
    both = f"{first},{second}"
    zookeeper = ["--zookeeper", cluster.zookeeper, "--root", cluster.paths.root]

    deadline = time.monotonic() + 90
    while True:  # until the coordinator has given each server its partition and both are mounted
        verified = waltz(*zookeeper, "cluster", "verify", "--server-addresses", both, "--expect-servers", "2")
        if verified.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert verified.returncode == 0 and verified.stdout.rstrip().endswith("PASSED"), verified.stdout + verified.stderr

    listed = waltz("--server-addresses", first, "server", "list", "--json")  # no ZooKeeper given at all
    assert listed.returncode == 0, listed.stderr
    servers = json.loads(listed.stdout)
    assert sorted(s["address"] for s in servers) == sorted([first, second])
    assert sorted(p for s in servers for p in s["partitions"]) == [0, 1] and all(s["server_id"] > 0 for s in servers)
    owned = waltz("server", "partitions", "--server-addresses", both, "--json")
    assert owned.returncode == 0, owned.stderr
    assert sorted(p["partition"] for s in json.loads(owned.stdout) for p in s["partitions"]) == [0, 1]
    produced = waltz("perf", "produce", "--server-addresses", both, "-d", "1", "--writers", "2", "--json")
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["transactions"] > 0

    cluster.servers[1].stop()
    gone = waltz(*zookeeper, "cluster", "verify", "--server-addresses", both, "--expect-servers", "2")
    assert gone.returncode == 1 and gone.stdout.rstrip().endswith("FAILED"), gone.stdout + gone.stderr
    assert "1 server(s) missing: 1 registered, 2 expected" in gone.stdout
    assert f"server {second} is missing: it is not registered" in gone.stdout
