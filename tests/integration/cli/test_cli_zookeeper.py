"""`waltz cluster` and `waltz storage` metadata commands against the real ZooKeeper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.cli.helpers import waltz
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta

BIN = Path(sys.executable).parent


@pytest.fixture
def cli(zookeeper, cluster_root, capsys):
    """Run `waltz --zookeeper ... --root <fresh root> ARGS` in-process."""

    def run(*argv: str):
        return waltz(capsys, "--zookeeper", zookeeper.connect_string, "--root", cluster_root, *argv)

    return run


def test_create_list_show_key_delete(cli, zk, cluster_root):
    created = cli("cluster", "create", "-n", "orders", "-p", "8", "--json")
    assert created.code == 0, created.err
    key = created.json()["cluster_key"]
    assert zkmeta.store_params(zk, zkmeta.ZkPaths(cluster_root)).cluster_key == key
    shown = cli("cluster", "show-key")
    assert shown.code == 0 and shown.out.strip() == key
    listed = cli("cluster", "list")
    assert listed.code == 0
    assert f"cluster 'orders' at {cluster_root}: 8 partitions, key {key}" in listed.out
    data = cli("cluster", "list", "--json").json()
    assert data["num_partitions"] == 8 and [p["session_id"] for p in data["partitions"]] == [-1] * 8
    again = cli("cluster", "create", "-n", "orders", "-p", "8")
    assert again.code == 1 and "already exists" in again.err
    wrong_name = cli("cluster", "delete", "-n", "other")
    assert wrong_name.code == 1 and "is named 'orders'" in wrong_name.err
    assert zk.exists(cluster_root) is not None
    deleted = cli("cluster", "delete", "-n", "orders")
    assert deleted.code == 0, deleted.err
    assert zk.exists(cluster_root) is None
    gone = cli("cluster", "show-key")
    assert gone.code == 1 and "has the cluster been created?" in gone.err


def test_storage_nodes_and_assignments(cli, zk, cluster_root):
    assert cli("cluster", "create", "-n", "c", "-p", "9").code == 0
    for n in range(3):
        added = cli("storage", "add-node", "-s", f"127.0.0.1:{7000 + n}", "-a", str(8000 + n), "-g", str(n))
        assert added.code == 0, added.err
    dup = cli("storage", "add-node", "-s", "127.0.0.1:7000", "-a", "8000")
    assert dup.code == 1 and "already in the cluster" in dup.err
    bad = cli("storage", "add-node", "-s", "no-port", "-a", "1")
    assert bad.code == 2 and "host:port" in bad.err
    assert cli("storage", "auto-assign", "-g", "0").code == 0
    assigned = cli("storage", "assign", "-s", "127.0.0.1:7001", "-p", "0-6,8")
    assert assigned.code == 0 and "0-6,8" in assigned.out
    assert cli("storage", "assign", "-s", "127.0.0.1:7002", "-p", "0-3").code == 0
    assert cli("storage", "unassign", "-s", "127.0.0.1:7002", "-p", "1-2").code == 0
    paths = zkmeta.ZkPaths(cluster_root)
    assert cluster_admin.replica_assignments(zk, paths) == {
        "127.0.0.1:7000": list(range(9)),
        "127.0.0.1:7001": [0, 1, 2, 3, 4, 5, 6, 8],
        "127.0.0.1:7002": [0, 3],
    }
    listed = cli("storage", "list", "--json").json()
    assert [(n["node"], n["group"], n["admin_port"]) for n in listed] == [
        ("127.0.0.1:7000", 0, 8000),
        ("127.0.0.1:7001", 1, 8001),
        ("127.0.0.1:7002", 2, 8002),
    ]
    human = cli("storage", "list").out.splitlines()
    assert human[2].split() == ["127.0.0.1:7000", "0", "8000", "0-8"]
    assert human[3].split() == ["127.0.0.1:7001", "1", "8001", "0-6,8"]
    out_of_range = cli("storage", "assign", "-s", "127.0.0.1:7002", "-p", "7-9")
    assert out_of_range.code == 2 and "partition 9 does not exist" in out_of_range.err
    busy = cli("storage", "remove-node", "-s", "127.0.0.1:7002")
    assert busy.code == 1 and "unassign them first" in busy.err
    assert cli("storage", "unassign", "-s", "127.0.0.1:7002", "-p", "0,3").code == 0
    assert cli("storage", "remove-node", "-s", "127.0.0.1:7002").code == 0
    assert "127.0.0.1:7002" not in cluster_admin.storage_nodes(zk, paths)


def test_verify_without_servers_or_nodes_fails_with_reasons(cli):
    assert cli("cluster", "create", "-n", "c", "-p", "2").code == 0
    assert cli("storage", "add-node", "-s", "127.0.0.1:1", "-a", "2").code == 0
    assert cli("storage", "assign", "-s", "127.0.0.1:1", "-p", "0").code == 0
    run = cli("cluster", "verify", "--timeout", "2")
    assert run.code == 1
    assert run.out.rstrip().endswith("FAILED")
    assert "partition 1 has no replica" in run.out
    assert "no server is registered" in run.out
    assert "storage node 127.0.0.1:1" in run.out


def test_config_file(zookeeper, cluster_root, capsys, tmp_path):
    conf = tmp_path / "cli.yaml"
    conf.write_text(yaml.safe_dump({"zookeeper.connectString": zookeeper.connect_string, "cluster.root": cluster_root}))
    assert waltz(capsys, "-c", str(conf), "cluster", "create", "-n", "c", "-p", "1").code == 0
    assert len(waltz(capsys, "-c", str(conf), "cluster", "show-key").out.strip()) == 36


def test_unreachable_zookeeper_is_one_line_and_fails(tmp_path):
    """The real entry point, as an operator runs it: one line on stderr, non-zero, no traceback."""
    result = subprocess.run(
        [str(BIN / "waltz"), "--zookeeper", "127.0.0.1:1", "--root", "/x", "--timeout", "2", "cluster", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == ["waltz: error: cannot reach ZooKeeper at 127.0.0.1:1 within 2 s: Connection time-out"], (
        result.stderr
    )
