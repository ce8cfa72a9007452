"""The chart's pods as Docker containers here: both images built from a locally made base, ZooKeeper, 3 storage
nodes and a server on the host network with the configuration files, command lines and environment the chart
renders (in-cluster names mapped to 127.0.0.1, ports to free loopback ports), the provisioning Job's command in a
container, the bank demo, then a storage container killed and started again on its volume: the demo's data is
intact and the replicas identical. Skips only where no container engine can be started."""

from __future__ import annotations

import hashlib
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import node_records
from tests.deploy import engine
from tests.deploy.chart import NAMESPACE, ROOT, find, manifests, render
from tests.deploy.containers import Pod, exit_code, logs, remove, wait_serving
from tests.deploy.engine import run
from waltz.v1 import metadata_pb2
from waltz_client.blocking import WaltzClient
from waltz_client.demo.bank import BankDatabase, run_demo
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import free_port
from waltz_storage.admin_client import StorageAdminClient

pytestmark = pytest.mark.slow

BUILD_TIMEOUT_S = 900
STORAGE_NODES = 3


@pytest.fixture(scope="module")
def docker(tmp_path_factory):
    """A Docker engine (started here as root if none runs; stopped by pid at the end)."""
    try:
        started = engine.start_engine(tmp_path_factory.mktemp("dockerd"))
    except engine.EngineUnavailable as exc:
        pytest.skip(f"no container engine can be started here: {exc}")
    try:
        yield started
    finally:
        started.stop()


def build(dockerfile: Path, tag: str, base: str) -> None:
    run(["docker", "build", "--network", "host", "-q", "-f", str(dockerfile), "--build-arg", f"BASE_IMAGE={base}",
         "-t", tag, str(ROOT)], BUILD_TIMEOUT_S)


@pytest.fixture(scope="module")
def images(docker) -> dict[str, str]:
    """Tags of the storage, server and (test-only) ZooKeeper images, built FROM the cached local base."""
    base = engine.base_image()
    zk_file = ROOT / "tests/deploy/zookeeper.Dockerfile"
    zk_tag = f"waltz-test-zookeeper:{hashlib.sha256(zk_file.read_bytes() + base.encode()).hexdigest()[:12]}"
    if not engine.image_exists(zk_tag):
        build(zk_file, zk_tag, base)
    build(ROOT / "Dockerfile.storage", "waltz-storage:test", base)
    build(ROOT / "Dockerfile.server", "waltz-server:test", base)
    return {"storage": "waltz-storage:test", "server": "waltz-server:test", "zookeeper": zk_tag}


class Deployment:
    """The rendered chart mapped onto this host: which name and port stands for what."""

    def __init__(self, workdir: Path, images: dict[str, str]) -> None:
        self.workdir, self.images = workdir, images
        self.run_id = uuid.uuid4().hex[:8]
        self.zk_port = free_port()
        self.values = {"zookeeper": {"enabled": False, "connectString": f"127.0.0.1:{self.zk_port}"},
                       "cluster": {"partitions": 4}}
        self.objects = manifests(render(self.values))
        self.storage_ports = [(free_port(), free_port(), free_port()) for _ in range(STORAGE_NODES)]
        self.server_ports = (free_port(), free_port())
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.configmaps = {o["metadata"]["name"]: o["data"] for o in self.objects if o["kind"] == "ConfigMap"}
        headless = find(self.objects, "Service", "-storage-headless")["metadata"]["name"]
        self.storage_set = find(self.objects, "StatefulSet", "-storage")
        self.hosts = [f"{self.storage_set['metadata']['name']}-{i}.{headless}.{NAMESPACE}.svc.cluster.local"
                      for i in range(STORAGE_NODES)]
        self.root = "/waltz/rel-waltz"

    def rewrite_storage(self, index: int) -> Any:
        port, admin, metrics = self.storage_ports[index]

        def rewrite(text: str) -> str:
            text = re.sub(r"^storage\.port: \d+$", f"storage.port: {port}", text, flags=re.M)
            text = re.sub(r"^storage\.admin\.port: \d+$", f"storage.admin.port: {admin}", text, flags=re.M)
            return re.sub(r"^storage\.metrics\.port: \d+$", f"storage.metrics.port: {metrics}", text, flags=re.M)

        return rewrite

    def rewrite_server(self, text: str) -> str:
        port, metrics = self.server_ports
        text = re.sub(r"^server\.port: \d+$", f"server.port: {port}", text, flags=re.M)
        return re.sub(r"^server\.metrics\.port: \d+$", f"server.metrics.port: {metrics}", text, flags=re.M)

    def rewrite_job(self, text: str) -> str:
        for host, (port, admin, _) in zip(self.hosts, self.storage_ports, strict=True):
            text = re.sub(rf"{re.escape(host)}:\d+:\d+", f"{host}:{port}:{admin}", text)
        return text

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

    def storage_pods(self) -> list[Pod]:
        pods = []
        for i in range(STORAGE_NODES):
            volume = f"waltz-test-{self.run_id}-data-{i}"
            self.volumes.append(volume)
            pod_name = f"{self.storage_set['metadata']['name']}-{i}"
            pods.append(self.pod(f"storage-{i}", self.storage_set, self.images["storage"],
                                 {"metadata.name": pod_name}, self.rewrite_storage(i), {"data": volume}))
        return pods

    def server_pod(self) -> Pod:
        deployment = find(self.objects, "Deployment", "-server")
        return self.pod("server-0", deployment, self.images["server"], {"status.podIP": "127.0.0.1"},
                        self.rewrite_server)

    def job_pod(self) -> Pod:
        return self.pod("provision", find(self.objects, "Job", "-provision"), self.images["server"], {},
                        self.rewrite_job)

    def client_config(self) -> dict[str, Any]:
        return {"zookeeper.connectString": f"127.0.0.1:{self.zk_port}", "cluster.root": self.root}


def replica_records(deployment: Deployment, cluster_key: str, partitions: int) -> list[dict[int, list[Any]]]:
    """Every storage node's records of every partition, read through its admin port."""
    found = []
    for _, admin_port, _ in deployment.storage_ports:
        with StorageAdminClient("127.0.0.1", admin_port, cluster_key, partitions) as admin:
            found.append(node_records(admin))
    return found


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


def test_chart_pods_run_the_bank_demo_and_survive_a_storage_restart(images):
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="waltz-containers-") as tmp:
        workdir = Path(tmp)
        deployment = Deployment(workdir, images)
        try:
            deployment.start_zookeeper()
            storage = deployment.storage_pods()
            server = deployment.server_pod()
            for pod in [*storage, server]:  # ensure-cluster: creates the empty cluster, then finds it
                pod.run_init_containers(timeout=120)
            for pod in storage:
                deployment.containers.append(pod.start())
            deployment.containers.append(server.start())
            for pod, (port, _, _) in zip(storage, deployment.storage_ports, strict=True):
                wait_serving(pod.name, port, timeout=60)
            wait_serving(server.name, deployment.server_ports[0], timeout=60)

            job = deployment.job_pod()
            for _ in range(2):  # the hook runs after install and again after an upgrade: the same result
                out = run(job.docker_run(job.spec["containers"][0], job.name, detach=False), 180).stdout
                run(["docker", "rm", "-f", job.name], 60, check=False)
            assert "assignments kept" in out and "storage nodes registered now: none" in out, out

            report = run_demo(deployment.client_config(), num_clients=2, num_transactions=120, num_accounts=4,
                              out=None)
            assert report.ok, report.problems

            zk = zkmeta.connect(f"127.0.0.1:{deployment.zk_port}")
            try:
                store = zkmeta.require(zk, f"{deployment.root}/store", metadata_pb2.StoreParams)[0]
            finally:
                zk.stop()
                zk.close()
            victim = storage[1].name
            run(["docker", "kill", victim], 60)
            run(["docker", "start", victim], 60)
            wait_serving(victim, deployment.storage_ports[1][0], timeout=60)

            assert replay_balances(deployment.client_config(), workdir) == report.balances
            deadline = time.monotonic() + 90
            while True:
                replicas = replica_records(deployment, store.cluster_key, store.num_partitions)
                if all(r == replicas[0] for r in replicas):
                    break
                assert time.monotonic() < deadline, "the restarted replica did not match the others in 90 s"
                time.sleep(0.5)
            assert {p: len(records) - 1 for p, records in replicas[0].items()} == report.high_water_marks

            for name in (server.name, storage[0].name):  # SIGTERM to PID 1: a graceful exit, not a kill
                run(["docker", "stop", "-t", "30", name], 60)
                assert exit_code(name) == 0, logs(name)[-2000:]
        finally:
            remove(deployment.containers, deployment.volumes)
    print(f"container test: {time.monotonic() - started:.1f} s")
