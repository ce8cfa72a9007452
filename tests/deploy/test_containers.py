"""The chart's pods as Docker containers here: both images built from a locally made base, ZooKeeper, 3 storage
nodes and a server on the host network with the configuration files, command lines and environment the chart
renders (in-cluster names mapped to 127.0.0.1, ports to free loopback ports), the provisioning Job's command in a
container, the bank demo, then a storage container killed and started again on its volume: the demo's data is
intact and the replicas identical. Skips only where no container engine can be started. The images are built
before the tests run, with a budget of their own (tests/deploy/images.py, WALTZ_IMAGE_BUILD_TIMEOUT)."""

from __future__ import annotations

import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import node_records
from tests.deploy.chart import NAMESPACE, ROOT, find, manifests, render
from tests.deploy.containers import Pod, exit_code, logs, remove, wait_serving
from tests.deploy.engine import run
from waltz.v1 import metadata_pb2
from waltz_client.blocking import WaltzClient
from waltz_client.demo.bank import BankDatabase, run_demo
from waltz_common import build_info
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import free_port
from waltz_storage.admin_client import StorageAdminClient

pytestmark = pytest.mark.slow

STORAGE_NODES = 3
MAX_STORAGE_NODES = 4  # after the scale-out
PARTITIONS = 4


class Deployment:
    """The rendered chart mapped onto this host: which name and port stands for what.

    Room is made for MAX_STORAGE_NODES storage nodes, so that an upgrade to more (render(count)) finds
    ports for the new ones; every storage name resolves to 127.0.0.1 in every container.
    """

    def __init__(self, workdir: Path, images: dict[str, str]) -> None:
        self.workdir, self.images = workdir, images
        self.run_id = uuid.uuid4().hex[:8]
        self.zk_port = free_port()
        # storage, admin, metrics and session port of each node
        self.storage_ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(MAX_STORAGE_NODES)]
        self.server_ports = (free_port(), free_port())
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.root = "/waltz/rel-waltz"
        self.render(STORAGE_NODES)

    def render(self, storage_nodes: int) -> None:
        """Render the chart as `helm install` or `helm upgrade --set storage.replicas=N` would."""
        values = {
            "zookeeper": {"enabled": False, "connectString": f"127.0.0.1:{self.zk_port}"},
            "cluster": {"partitions": PARTITIONS},
            "storage": {"replicas": storage_nodes},
        }
        self.objects = manifests(render(values))
        self.configmaps = {o["metadata"]["name"]: o["data"] for o in self.objects if o["kind"] == "ConfigMap"}
        headless = find(self.objects, "Service", "-storage-headless")["metadata"]["name"]
        self.storage_set = find(self.objects, "StatefulSet", "-storage")
        self.hosts = [f"{self.storage_set['metadata']['name']}-{i}.{headless}.{NAMESPACE}.svc.cluster.local"
                      for i in range(MAX_STORAGE_NODES)]

    def rewrite_storage(self, index: int) -> Any:
        port, admin, metrics, session = self.storage_ports[index]

        def rewrite(text: str) -> str:
            text = re.sub(r"^storage\.port: \d+$", f"storage.port: {port}", text, flags=re.M)
            text = re.sub(r"^storage\.sessionPort: \d+$", f"storage.sessionPort: {session}", text, flags=re.M)
            text = re.sub(r"^storage\.admin\.port: \d+$", f"storage.admin.port: {admin}", text, flags=re.M)
            return re.sub(r"^storage\.metrics\.port: \d+$", f"storage.metrics.port: {metrics}", text, flags=re.M)

        return rewrite

    def rewrite_server(self, text: str) -> str:
        port, metrics = self.server_ports
        text = re.sub(r"^server\.port: \d+$", f"server.port: {port}", text, flags=re.M)
        return re.sub(r"^server\.metrics\.port: \d+$", f"server.metrics.port: {metrics}", text, flags=re.M)

    def rewrite_job(self, text: str) -> str:
        for host, (port, admin, *_) in zip(self.hosts, self.storage_ports, strict=True):
            text = re.sub(rf"{re.escape(host)}:\d+:\d+", f"{host}:{port}:{admin}", text)
        return text

    def node(self, index: int) -> str:
        """Storage node index's identity (connect string) on this host."""
        return f"{self.hosts[index]}:{self.storage_ports[index][0]}"

    def pod(self, name: str, workload: dict[str, Any], image: str, fields: dict[str, str], rewrite: Any,
            volumes: dict[str, str] | None = None) -> Pod:
        return Pod(f"waltz-test-{self.run_id}-{name}", workload["spec"]["template"]["spec"], image, fields,
                   self.workdir, rewrite, self.hosts, volumes or {}, self.configmaps)

    def start_zookeeper(self) -> None:
        conf = self.workdir / "zookeeper"
        conf.mkdir(mode=0o755)
        conf.chmod(0o755)
        (conf / "zoo.cfg").write_text(
            f"tickTime=2000\ndataDir=/data\nclientPort={self.zk_port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr,envi\n")
        (conf / "zoo.cfg").chmod(0o644)
        name = f"waltz-test-{self.run_id}-zookeeper"
        self.containers.append(name)
        run(["docker", "run", "-d", "--name", name, "--network", "host", "--user", "10001:10001",
             "--mount", "type=tmpfs,destination=/data,tmpfs-mode=1777", "-v", f"{conf}:/conf:ro",
             self.images["zookeeper"]], 60)

    def storage_pod(self, index: int) -> Pod:
        volume = f"waltz-test-{self.run_id}-data-{index}"
        self.volumes.append(volume)
        pod_name = f"{self.storage_set['metadata']['name']}-{index}"
        return self.pod(f"storage-{index}", self.storage_set, self.images["storage"], {"metadata.name": pod_name},
                        self.rewrite_storage(index), {"data": volume})

    def start_pod(self, pod: Pod, port: int) -> None:
        """Run the init containers, start the main one, wait until its readiness probe would pass."""
        pod.run_init_containers(timeout=120)
        self.containers.append(pod.start())
        wait_serving(pod.name, port, timeout=60)

    def server_pod(self) -> Pod:
        deployment = find(self.objects, "Deployment", "-server")
        return self.pod("server-0", deployment, self.images["server"], {"status.podIP": "127.0.0.1"},
                        self.rewrite_server)

    def run_job(self) -> str:
        """The provisioning hook's container, run to completion; its output."""
        job = self.pod("provision", find(self.objects, "Job", "-provision"), self.images["server"], {},
                       self.rewrite_job)
        try:
            return run(job.docker_run(job.spec["containers"][0], job.name, detach=False), 180).stdout
        finally:
            run(["docker", "rm", "-f", job.name], 60, check=False)

    def waltz(self, *args: str) -> str:
        """The `waltz` CLI in a container of the server image, as from an admin pod."""
        name = f"waltz-test-{self.run_id}-admin"
        command = ["docker", "run", "--rm", "--name", name, "--network", "host", "--read-only", "--entrypoint", "waltz"]
        command += [a for host in self.hosts for a in ("--add-host", f"{host}:127.0.0.1")]
        command += [self.images["server"], "--zookeeper", f"127.0.0.1:{self.zk_port}", "--root", self.root, *args]
        return run(command, 180).stdout

    def client_config(self) -> dict[str, Any]:
        return {"zookeeper.connectString": f"127.0.0.1:{self.zk_port}", "cluster.root": self.root}


def replica_records(deployment: Deployment, nodes: int, cluster_key: str) -> dict[int, dict[int, list[Any]]]:
    """partition -> storage node index -> its records, read through the nodes' admin ports."""
    found: dict[int, dict[int, list[Any]]] = {}
    for index, (_, admin_port, *_) in enumerate(deployment.storage_ports[:nodes]):
        with StorageAdminClient("127.0.0.1", admin_port, cluster_key, PARTITIONS) as admin:
            for pid, records in node_records(admin).items():
                found.setdefault(pid, {})[index] = records
    return found


def wait_identical(deployment: Deployment, nodes: int, cluster_key: str, timeout: float = 90) -> dict[int, Any]:
    """The replicas once every partition's are identical (a restarted or new one catches up in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        replicas = replica_records(deployment, nodes, cluster_key)
        if all(all(r == next(iter(held.values())) for r in held.values()) for held in replicas.values()):
            return replicas
        assert time.monotonic() < deadline, f"replicas still differ after {timeout} s"
        time.sleep(0.5)


def replay_balances(config: dict[str, Any], workdir: Path, timeout: float = 90) -> dict[int, int]:
    """A fresh bank instance with an empty database, fed the whole log: the balances it arrives at."""
    database = BankDatabase(workdir / f"replay-{uuid.uuid4().hex[:6]}.db")
    client = WaltzClient(database, config)
    try:
        client.wait_mounted()
        ends = {p: client.high_water_mark(p) for p in range(client.num_partitions)}
        deadline = time.monotonic() + timeout
        while any(client.client_high_water_mark(p) < h for p, h in ends.items()):
            assert time.monotonic() < deadline, f"the replay did not reach {ends}"
            time.sleep(0.05)
        return dict(database.query_all("SELECT account_id, balance FROM accounts"))
    finally:
        client.close()
        database.close()


def test_the_images_say_which_commit_they_were_built_from(images):
    """.dockerignore leaves .git out of the build: the commit comes as a build argument (tests/deploy/images.py),
    and every command of the images says it (waltz_build_info carries the same)."""
    commit = build_info.git_commit(ROOT)
    if commit is None:
        pytest.skip("not a git checkout: the images were built without a commit")
    for image, commands in ((images["storage"], ("waltz-storage",)), (images["server"], ("waltz-server", "waltz"))):
        for command in commands:
            said = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", command, image, "--version"],
                       120).stdout
            assert said.startswith(f"{command} ") and f"(commit {commit[0]}," in said, said


def test_chart_pods_run_the_bank_demo_survive_a_restart_scale_out_and_a_rolling_restart(images):
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="waltz-containers-") as tmp:
        workdir = Path(tmp)
        deployment = Deployment(workdir, images)
        try:
            # install: ZooKeeper (external), storage nodes and a server (their init containers create the
            # empty cluster), then the post-install hook; run again (post-upgrade) it changes nothing
            deployment.start_zookeeper()
            storage = [deployment.storage_pod(i) for i in range(STORAGE_NODES)]
            for i, pod in enumerate(storage):
                deployment.start_pod(pod, deployment.storage_ports[i][0])
            server = deployment.server_pod()
            deployment.start_pod(server, deployment.server_ports[0])
            first = deployment.run_job()
            assert "replicas assigned now: first install" in first, first
            again = deployment.run_job()
            assert "assignments kept" in again and "storage nodes registered now: none" in again, again

            report = run_demo(deployment.client_config(), num_clients=2, num_transactions=120, num_accounts=4,
                              out=None)
            assert report.ok, report.problems
            key = cluster_key(deployment)

            # kill -9 a storage node, start it again on its volume
            run(["docker", "kill", storage[1].name], 60)
            run(["docker", "start", storage[1].name], 60)
            wait_serving(storage[1].name, deployment.storage_ports[1][0], timeout=60)
            assert replay_balances(deployment.client_config(), workdir) == report.balances
            replicas = wait_identical(deployment, STORAGE_NODES, key)
            assert {p: len(next(iter(held.values()))) - 1 for p, held in replicas.items()} == report.high_water_marks
            assert all(len(held) == 3 for held in replicas.values())

            # scale out (helm upgrade --set storage.replicas=4): the hook registers the new node, which holds
            # nothing until the operator copies a replica onto it
            deployment.render(MAX_STORAGE_NODES)
            storage.append(deployment.storage_pod(3))
            deployment.start_pod(storage[3], deployment.storage_ports[3][0])
            scaled = deployment.run_job()
            assert f"registered now: ['{deployment.node(3)}']" in scaled and "holding no replica yet" in scaled
            deployment.waltz("storage", "recover-partition", "-s", deployment.node(0), "-d", deployment.node(3),
                             "-p", "0")

            # a rolling restart, as an upgrade does it: storage nodes highest ordinal first, then the server,
            # each stopped with SIGTERM (a graceful exit, code 0) and ready again before the next
            for index in reversed(range(MAX_STORAGE_NODES)):
                restart_gracefully(storage[index].name, deployment.storage_ports[index][0])
            restart_gracefully(server.name, deployment.server_ports[0])

            more = run_demo(deployment.client_config(), num_clients=2, num_transactions=60, num_accounts=4,
                            out=None, seed=2)
            assert more.ok, more.problems
            assert replay_balances(deployment.client_config(), workdir) == more.balances
            replicas = wait_identical(deployment, MAX_STORAGE_NODES, key)
            assert sorted(replicas[0]) == [0, 1, 2, 3] and all(sorted(replicas[p]) == [0, 1, 2] for p in (1, 2, 3))
            assert {p: len(held[0]) - 1 for p, held in replicas.items()} == more.high_water_marks
            assert deployment.waltz("cluster", "verify").rstrip().endswith("PASSED")
        except BaseException:
            for name in deployment.containers:  # pytest shows them with the failure
                print(f"===== the logs of {name} (last 8000 characters)\n{logs(name)[-8000:]}")
            raise
        finally:
            remove(deployment.containers, deployment.volumes)
    print(f"container test: {time.monotonic() - started:.1f} s")


def cluster_key(deployment: Deployment) -> str:
    zk = zkmeta.connect(f"127.0.0.1:{deployment.zk_port}")
    try:
        return str(zkmeta.require(zk, f"{deployment.root}/store", metadata_pb2.StoreParams)[0].cluster_key)
    finally:
        zk.stop()
        zk.close()


def restart_gracefully(name: str, port: int) -> None:
    run(["docker", "stop", "-t", "30", name], 60)
    assert exit_code(name) == 0, logs(name)[-2000:]
    run(["docker", "start", name], 60)
    wait_serving(name, port, timeout=60)
