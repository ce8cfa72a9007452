"""A rolling upgrade from the previous release under a checked load (issue 44, docs/operations.md "Upgrades").

A cluster of release PREVIOUS (its services exported from this repository's own history by
bench.package_baseline.export_trees, and run from that tree with this environment's packages) is rolled to this
checkout one process at a time, as an operator does: a SIGTERM or a kill -9 of the old process, then the new release
started on the same data directory and ports, with this release's configuration (storage.sessionPort turned on).
While each process is down the load goes on for DOWN_APPENDS acknowledged appends, and storage.checkpointInterval is
short, so that every partition starts a new store session while a storage node is away: the node comes back behind
the session's high-water mark, the case the issue met (a server of the previous release sets a replica's low-water
mark before it copies the replica up to it). After each step every replica must be back in the write set of each of
its partitions within WRITE_SET_BOUND_S (a deadline on a state, not a timing); at the end the history checker
(tests/chaos/history.py) checks every acknowledged append against the log, and the replicas are compared.

The default run rolls storage nodes first (the documented order), five steps. WALTZ_SLOW=1 runs servers first too,
and restarts more in the mixed window: a storage node of this release again under servers of the previous one, and
one of the previous release under servers of this one. At the end each server must be connected to every storage
node through its framed session port (storage.sessionPort, turned on as each node starts at this release).

The previous release comes from git history: a shallow clone (without PREVIOUS) skips, saying so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.package_baseline import export_trees
from bench.revisions import REPO, RevisionError
from tests.chaos.cluster import PARTITIONS, SERVER_OVERRIDES, run
from tests.chaos.test_faults import SLOW, STEP, check_run, report
from tests.chaos.test_rolling_restarts import fully_healthy
from tests.chaos.test_zookeeper_faults import Writers, writing_from
from tests.chaos.timed import timed_fault
from tests.chaos.timing import table
from waltz_common.testing.local_cluster import LocalCluster, ManagedProcess, StorageNode
from waltz_common.testing.zookeeper import ZooKeeperProcess

PREVIOUS = "7175f3a"
"""The previous release: the revision docs/operations.md's compatibility rule names."""
TREES = ("common", "services/storage", "services/server")
"""What the previous release's services import (its generated protocol modules are in common/waltz/v1)."""
CLIENT_TREES = ("common", "clients/python")
"""What the previous release's client imports."""
SECONDS_KEYS = {
    "zookeeper.sessionTimeoutSeconds": "zookeeper.sessionTimeout",
    "zookeeper.connectTimeoutSeconds": "zookeeper.connectTimeout",
}
"""Keys renamed since PREVIOUS: seconds now, milliseconds in its configuration."""
WRITE_SET_BOUND_S = 30.0
DOWN_APPENDS = 400  # acknowledged while a process is down: more than a checkpoint interval on every partition
CHECKPOINT_INTERVAL = 60  # transactions of a partition after which its store session ends and a new one recovers

Step = tuple[str, str, bool]
"""(process name, "SIGTERM" or "kill -9", whether it comes back at this release rather than its own)."""
STORAGE_FIRST: list[Step] = [
    ("storage-0", "SIGTERM", True),
    ("storage-1", "kill -9", True),
    *([("storage-0", "kill -9", False), ("storage-1", "SIGTERM", False)] if SLOW else []),
    ("storage-2", "SIGTERM", True),
    ("server-0", "kill -9", True),
    ("server-1", "SIGTERM", True),
]
SERVERS_FIRST: list[Step] = [
    ("server-0", "SIGTERM", True),
    ("server-1", "kill -9", True),
    ("storage-0", "kill -9", False),
    ("storage-0", "SIGTERM", True),
    ("storage-1", "kill -9", True),
    ("storage-2", "SIGTERM", True),
]


@dataclass(frozen=True)
class Release:
    """The previous release's exported tree, and the configuration keys its services accept."""

    root: Path
    storage_keys: frozenset[str]
    server_keys: frozenset[str]

    @property
    def pythonpath(self) -> str:
        return os.pathsep.join(str(self.root / tree) for tree in TREES)

    def command(self, module: str) -> list[str]:
        """The service's main() of this release (env execs Python: the pid is the service's own)."""
        main = f"import sys; from {module} import main; sys.exit(main())"
        return ["env", f"PYTHONPATH={self.pythonpath}", sys.executable, "-c", main]

    def config(self, config: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
        """This release's configuration of a process as the previous release reads it: renamed keys under their
        old names and units, keys it does not know left out (storage.sessionPort: it has none)."""
        found: dict[str, Any] = {}
        for key, value in config.items():
            if key in keys:
                found[key] = value
            elif SECONDS_KEYS.get(key) in keys:
                found[SECONDS_KEYS[key]] = round(float(value) * 1000)
        return found


PROBE = """
import json, sys
import waltz.v1.storage_pb2, waltz_common, waltz_server, waltz_storage
from waltz_server.config import all_keys
from waltz_storage.config import STORAGE_KEYS
modules = (waltz.v1.storage_pb2, waltz_common, waltz_server, waltz_storage)
print(json.dumps({"files": [m.__file__ for m in modules], "storage": [k.name for k in STORAGE_KEYS],
                  "server": [k.name for k in all_keys()]}))
"""


def previous_release() -> Release:
    """PREVIOUS exported (once, in the benchmark cache) and checked to import from its own tree; skips when this
    clone's history lacks it."""
    try:
        _, root = export_trees(PREVIOUS, (*TREES, *CLIENT_TREES), "release")
    except (RevisionError, subprocess.CalledProcessError) as exc:
        shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        pytest.skip(f"the upgrade test runs release {PREVIOUS} from this repository's history, which this "
                    f"{'shallow ' if shallow == 'true' else ''}clone cannot give ({exc}): use a full git clone")
    release = Release(root, frozenset(), frozenset())
    env = {**os.environ, "PYTHONPATH": release.pythonpath}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    wrong = [f for f in found["files"] if not Path(f).is_relative_to(root)]
    assert not wrong, f"the previous release's processes would import this checkout's code: {wrong}"
    return Release(root, frozenset(found["storage"]), frozenset(found["server"]))


class UpgradingCluster(LocalCluster):
    """A LocalCluster whose storage nodes and servers start at the previous release; upgrade() moves one process to
    this release (its own command and configuration) for its next start."""

    def __init__(self, workdir: Path, previous: Release, **kwargs: Any) -> None:
        self.previous = previous
        self._current: dict[str, tuple[list[str], Path]] = {}
        super().__init__(workdir, **kwargs)

    def _storage_node(self, index: int) -> StorageNode:
        node = super()._storage_node(index)
        self._at_previous(node, "waltz_storage.main", self.previous.storage_keys)
        return node

    def _server_node(self, index: int) -> Any:
        server = super()._server_node(index)
        self._at_previous(server, "waltz_server.main", self.previous.server_keys)
        return server

    def _at_previous(self, process: ManagedProcess, module: str, keys: frozenset[str]) -> None:
        self._current[process.name] = (process.command, process.config_path)
        config = yaml.safe_load(process.config_path.read_text())
        path = process.config_path.with_name(f"previous-{process.config_path.name}")
        path.write_text(yaml.safe_dump(self.previous.config(config, keys)))
        process.command, process.config_path = self.previous.command(module), path

    def upgrade(self, process: ManagedProcess) -> None:
        process.command, process.config_path = self._current[process.name]

    def release(self, process: ManagedProcess) -> str:
        return "this release" if process.command == self._current[process.name][0] else PREVIOUS

    def process(self, name: str) -> ManagedProcess:
        (found,) = [p for p in [*self.storage, *self.servers] if p.name == name]
        return found


async def more_acknowledged(load: Writers, count: int, what: str) -> None:
    """Until count more appends than now are acknowledged."""
    await load.acknowledged_at_least(load.acknowledged + count, what)


async def every_replica_back(cluster: LocalCluster, took: list[float]) -> None:
    """Until every replica is in the write sets of its partitions (within WRITE_SET_BOUND_S); the wait to took."""
    started = time.monotonic()
    await fully_healthy(cluster, WRITE_SET_BOUND_S)
    took.append(time.monotonic() - started)


async def upgrade_under_load(cluster: UpgradingCluster, steps: list[Step], name: str) -> None:
    await fully_healthy(cluster)
    recoveries = []
    async with writing_from(cluster, clients=2, submitters=2, limit=10**9) as load:  # bounded by the steps
        await load.acknowledged_at_least(STEP, "before the upgrade")
        for process_name, how, upgrade in steps:
            process = cluster.process(process_name)
            before = cluster.release(process)

            def start(process: ManagedProcess = process, upgrade: bool = upgrade) -> None:
                if upgrade:
                    cluster.upgrade(process)
                process.start()

            back: list[float] = []
            found, _ = await timed_fault(
                load,
                f"{how} {process_name}",
                process.stop if how == "SIGTERM" else process.kill,
                start,
                partial(more_acknowledged, load, DOWN_APPENDS, f"while {process_name} is down"),
                STEP,
                settle=partial(every_replica_back, cluster, back),
                partitions=PARTITIONS,
            )
            recoveries.append(found)
            report(name, f"{how} {process_name} ({before} -> {cluster.release(process)}): every replica in its write "
                         f"sets {back[0]:.1f} s after the start; {found.describe()}")
    print("\n".join(table(recoveries)))
    assert all(cluster.release(p) == "this release" for p in [*cluster.storage, *cluster.servers])
    for server in cluster.servers:
        assert transports(server.new_log()) == {n.connect_string: "framed" for n in cluster.storage}, server.name
    await check_run(cluster, load.writers, name)


def transports(log: str) -> dict[str, str]:
    """Storage node -> the transport of a server's latest connection to it, from its log ("storage 127.0.0.1:5:
    connected (epoch 2, framed session port 6)" or "(epoch 1, gRPC stream)")."""
    found = {}
    for line in log.splitlines():
        match = re.search(r"storage (\S+): connected \(epoch \d+, (framed session port|gRPC stream)", line)
        if match:
            found[match[1]] = "framed" if match[2].startswith("framed") else "gRPC"
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("order", ["storage first", "servers first"])
def test_a_rolling_upgrade_from_the_previous_release_under_load(
    order: str, zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    if order == "servers first" and not SLOW:
        pytest.skip("the default suite rolls storage first (the documented order); WALTZ_SLOW=1 runs both")
    previous = previous_release()
    overrides = {**SERVER_OVERRIDES, "storage.checkpointInterval": CHECKPOINT_INTERVAL}
    cluster = UpgradingCluster(
        tmp_path / "cluster",
        previous,
        storage_nodes=3,
        servers=2,
        partitions=PARTITIONS,
        zookeeper=zookeeper.connect_string,
        cluster_root=cluster_root,
        server_overrides=overrides,
    )
    steps = STORAGE_FIRST if order == "storage first" else SERVERS_FIRST
    with cluster:
        run(lambda: upgrade_under_load(cluster, steps, f"upgrade, {order}"), timeout=800)


OLD_CLIENT = """
import asyncio, json, sys
from waltz_client import AsyncWaltzClient, TransactionContext, WaltzClientCallbacks
import waltz_client

class Fed(WaltzClientCallbacks):
    def __init__(self):
        self.log = {}
    def get_client_high_water_mark(self, partition_id):
        return len(self.log.get(partition_id, [])) - 1
    def apply_transaction(self, transaction):
        self.log.setdefault(transaction.partition_id, []).append(transaction.data().decode())

class Put(TransactionContext):
    def __init__(self, i):
        self.i = i
    def partition_id(self, num_partitions):
        return self.i % num_partitions
    def execute(self, builder):
        builder.set_data(f"old client {self.i}".encode())
        return True

async def main(config, count):
    async with AsyncWaltzClient(Fed(), config) as writer:
        await writer.wait_mounted()
        futures = [await writer.submit(Put(i)) for i in range(count)]
        acknowledged = [i for i, ok in enumerate(await asyncio.gather(*futures)) if ok is True]
    fed = Fed()
    async with AsyncWaltzClient(fed, config) as reader:  # a fresh consumer: every transaction's data fetched
        await reader.wait_mounted()
        ends = {p: await reader.high_water_mark(p) for p in range(reader.num_partitions)}
        while any(reader.client_high_water_mark(p) < h for p, h in ends.items()):
            await asyncio.sleep(0.05)
    print(json.dumps({"client": waltz_client.__file__, "acknowledged": acknowledged, "log": fed.log}))

asyncio.run(main(json.loads(sys.argv[1]), int(sys.argv[2])))
"""


def test_a_client_of_the_previous_release_with_servers_of_this_one(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """The other direction of the client/server rule (the upgrade test's load is a client of this release, against
    servers of both): a client of PREVIOUS appends through this release's servers, and a fresh consumer of that
    release reads every acknowledged append back, its data fetched, exactly once."""
    previous = previous_release()
    count = 200
    with LocalCluster(tmp_path / "cluster", storage_nodes=3, servers=1, partitions=PARTITIONS,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root) as cluster:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(previous.root / t) for t in CLIENT_TREES)}
        done = subprocess.run([sys.executable, "-c", OLD_CLIENT, json.dumps(cluster.client_config()), str(count)],
                              env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(found["client"]).is_relative_to(previous.root), found["client"]
    assert found["acknowledged"] == list(range(count))
    read = sorted(data for records in found["log"].values() for data in records)
    assert read == sorted(f"old client {i}" for i in range(count))
