"""LocalCluster: ZooKeeper, storage nodes and servers as real processes on loopback ports."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kazoo.client import KazooClient

from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.fault_proxy import FaultProxy
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_common.tls import TlsFiles

BIN = Path(sys.executable).parent


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def listening_port_range() -> tuple[int, int]:
    """Ports the kernel never gives to outgoing connections: the half below its ephemeral range."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default lower bound
    return max(1024, low // 2), low - 1


def free_port() -> int:
    """A loopback port that is free now, for a process to listen on later.

    Taken below the ephemeral range: a port the kernel picked with bind(0) comes from that range,
    and any outgoing connection (a client, ZooKeeper, another test) may be given it before the
    process binds it, or while a killed process is down before its restart (EADDRINUSE).
    """
    low, high = _worker_share(*listening_port_range())
    if high - low >= 1000:
        for _ in range(200):
            port = random.randint(low, high)
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker_share(low: int, high: int) -> tuple[int, int]:
    """Under pytest-xdist (PYTEST_XDIST_WORKER gwN of PYTEST_XDIST_WORKER_COUNT), worker N's own slice of the range:
    _handed_out is per process, so two workers could hand out the same port, or one a port that another worker's
    killed process still needs for its restart (seen once: a storage node's "address in use" at cluster start)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    index, total = int(worker[2:]), int(count)
    size = (high - low + 1) // total
    return low + index * size, low + (index + 1) * size - 1


@dataclass
class ManagedProcess:
    """A service process with its config file and log; started and stopped by LocalCluster."""

    name: str
    command: list[str]
    config_path: Path
    log_path: Path
    ready_marker: str
    process: subprocess.Popen[bytes] | None = None
    new_session: bool = False  # in a session of its own: a terminal's Ctrl-C reaches only whoever started it
    _log_offset: int = 0

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                [*self.command, str(self.config_path)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=self.new_session,
            )
        finally:
            log.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_marker in self.new_log():
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.new_log()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready within {timeout:g} s:\n{self.new_log()[-3000:]}")

    def new_log(self) -> str:
        """What the process logged since its last start."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send sig (kill -9 by default) and wait for the process to go."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait for a graceful exit (SIGKILL after timeout); returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return self.process.returncode


@dataclass
class StorageNode(ManagedProcess):
    port: int = 0
    admin_port: int = 0
    metrics_port: int = 0
    health_port: int = 0
    """The plaintext health-only port (storage.health.port), when the cluster has health ports; else 0."""
    directory: Path = field(default_factory=Path)
    proxy: FaultProxy | None = None
    """In front of the data port (and the session port) when the cluster is proxied: servers reach the node
    through it."""
    session_port: int = 0
    """The framed Session port (storage.sessionPort); 0 when the cluster runs without (session_ports=False)."""

    @property
    def connect_string(self) -> str:
        """The node's identity in the cluster, where servers connect (its proxy, if it has one)."""
        return self.proxy.address if self.proxy is not None else f"127.0.0.1:{self.port}"


@dataclass
class ServerNode(ManagedProcess):
    port: int = 0
    metrics_port: int = 0
    health_port: int = 0
    """The plaintext health-only port (server.health.port), when the cluster has health ports; else 0."""
    proxy: FaultProxy | None = None
    """In front of the client port when the cluster is proxied: clients are told to reach the server there."""
    zookeeper_proxy: FaultProxy | None = None
    """Between this server and ZooKeeper when the cluster is proxied."""

    @property
    def address(self) -> str:
        """Where the server listens (tests and tools reach it here directly)."""
        return f"127.0.0.1:{self.port}"


class LocalCluster:
    """A whole Waltz cluster in a work directory; a context manager that always cleans up.

    ``LocalCluster(workdir, storage_nodes=3, servers=1, partitions=1).start()`` starts ZooKeeper,
    creates the cluster, starts the storage nodes (each its own replica group, every partition on
    every node), assigns the replicas on each node and starts the servers. ``server_overrides``
    and ``storage_overrides`` add or replace configuration keys. ``proxied`` puts a FaultProxy
    (waltz_common.testing.fault_proxy) between the servers and each storage node, between clients and
    each server, and between each server and ZooKeeper, for network faults. ``detach`` starts every
    process in a session of its own, so that a terminal's Ctrl-C reaches only the program that owns the
    cluster, which then stops them in order. ``tls=True`` makes development certificates in
    ``workdir/tls`` (waltz_common.devcerts) and runs every channel with mutual TLS; ``tls_files(role)``
    gives the files of a role, ``client_config()`` an application's. ``health_ports=True`` gives every
    process a plaintext health-only port too (``storage.health.port``, ``server.health.port``).
    ``session_ports=False`` starts the storage nodes without their framed Session port (``storage.sessionPort``):
    servers then use the gRPC stream, as with an older storage node.
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        storage_nodes: int = 3,
        servers: int = 1,
        partitions: int = 1,
        cluster_root: str = "/waltz/local",
        name: str = "local",
        zookeeper: str | None = None,
        server_overrides: dict[str, Any] | None = None,
        storage_overrides: dict[str, Any] | None = None,
        proxied: bool = False,
        detach: bool = False,
        tls: bool = False,
        health_ports: bool = False,
        session_ports: bool = True,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.num_storage = storage_nodes
        self.num_servers = servers
        self.num_partitions = partitions
        self.paths = zkmeta.ZkPaths(cluster_root)
        self.name = name
        self.server_overrides = server_overrides or {}
        self.storage_overrides = storage_overrides or {}
        self.proxied = proxied
        self.health_ports = health_ports
        self.session_ports = session_ports
        self._own_zookeeper = zookeeper is None
        self.detach = detach
        self.zookeeper_process = (
            ZooKeeperProcess(self.workdir / "zookeeper", new_session=detach) if zookeeper is None else None
        )
        self.zookeeper = zookeeper or ""
        self.cluster_key = ""
        self.storage: list[StorageNode] = []
        self.servers: list[ServerNode] = []
        self.tls_dir: Path | None = None
        if tls:
            from waltz_common import devcerts

            self.tls_dir = self.workdir / "tls"
            devcerts.write(self.tls_dir)

    def tls_files(self, role: str) -> TlsFiles | None:
        """The PEM files of a role's development certificate; None without TLS."""
        if self.tls_dir is None:
            return None
        d = self.tls_dir
        return TlsFiles(str(d / f"{role}.pem"), str(d / f"{role}-key.pem"), str(d / "ca.pem"))

    def tls_config(self, role: str) -> dict[str, Any]:
        """The tls.* configuration keys of a role (empty without TLS)."""
        files = self.tls_files(role)
        return {} if files is None else files.as_config()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        try:
            if self.zookeeper_process is not None:
                self.zookeeper = self.zookeeper_process.start()
            zk = zkmeta.connect(self.zookeeper)
            try:
                self._set_up(zk)
            finally:
                zk.stop()
                zk.close()
            for node in self.storage:
                node.start()
                self.assign_storage_partitions(node)
            for index in range(self.num_servers):
                self.add_server(index)
        except BaseException:
            self.stop()
            raise
        return self

    def _set_up(self, zk: KazooClient) -> None:
        """Create the cluster in ZooKeeper and register its storage nodes (each its own group)."""
        self.cluster_key = cluster_admin.create_cluster(zk, self.paths, self.name, self.num_partitions)
        for index in range(self.num_storage):
            node = self._storage_node(index)
            self.storage.append(node)
            cluster_admin.add_storage_node(zk, self.paths, node.connect_string, node.admin_port, group=index)
            cluster_admin.assign_partitions(zk, self.paths, node.connect_string, range(self.num_partitions))

    def _ports(self, name: str, count: int) -> list[int]:
        """count free ports for the process called name (its service port first)."""
        return [free_port() for _ in range(count)]

    def add_server(self, index: int | None = None) -> ServerNode:
        server = self._server_node(len(self.servers) if index is None else index)
        self.servers.append(server)
        server.start()
        return server

    def add_storage_node(self) -> StorageNode:
        """Start one more storage node, registered in ZooKeeper in a replica group of its own, assigned nothing
        (an operator grows the cluster onto it: `waltz storage add-replica`, `drain --to`)."""
        node = self._storage_node(len(self.storage))
        self.storage.append(node)
        zk = zkmeta.connect(self.zookeeper)
        try:
            cluster_admin.add_storage_node(zk, self.paths, node.connect_string, node.admin_port,
                                           group=len(self.storage) - 1)
        finally:
            zk.stop()
            zk.close()
        node.start()
        return node

    def assign_storage_partitions(self, node: StorageNode, partitions: range | None = None) -> None:
        """Create the partitions' files on a storage node through its admin port."""
        from waltz_storage.admin_client import StorageAdminClient

        with StorageAdminClient(
            "127.0.0.1", node.admin_port, self.cluster_key, self.num_partitions, tls_files=self.tls_files("operator")
        ) as client:
            existing = {p.partition_id for p in client.list_partitions()}
            for pid in partitions if partitions is not None else range(self.num_partitions):
                if pid not in existing:
                    client.assign(pid)

    def stop(self) -> None:
        """Stop servers, then storage nodes, then ZooKeeper; never leaves a process behind."""
        for process in [*self.servers, *self.storage]:
            try:
                process.stop(timeout=15)
            except Exception:  # cleanup must reach every process
                process.kill()
        for proxy in self.proxies():
            proxy.stop()
        if self.zookeeper_process is not None:
            self.zookeeper_process.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration -----------------------------------------------------------------------
    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """Configuration keys for a client of this cluster (dotted names)."""
        return {
            "zookeeper.connectString": self.zookeeper,
            "cluster.root": self.paths.root,
            **self.tls_config("application"),
            **overrides,
        }

    def write_client_config(self, name: str = "client.yaml", **overrides: Any) -> Path:
        path = self.workdir / name
        path.write_text(yaml.safe_dump(self.client_config(**overrides)))
        return path

    def _common(self) -> dict[str, Any]:
        return {"zookeeper.connectString": self.zookeeper, "cluster.root": self.paths.root}

    def _storage_node(self, index: int) -> StorageNode:
        name = f"storage-{index}"
        port, admin_port, metrics_port = self._ports(name, 3)
        health_port = free_port() if self.health_ports else 0
        session_port = free_port() if self.session_ports else 0
        directory = self.workdir / name / "data"
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            **self._common(),
            "storage.host": "127.0.0.1",
            "storage.port": port,
            "storage.admin.port": admin_port,
            "storage.metrics.port": metrics_port,
            "storage.directory": str(directory),
            **({"storage.health.port": health_port} if health_port else {}),
            **({"storage.sessionPort": session_port} if session_port else {}),
            **self.tls_config("storage"),
        }
        proxy = None
        if self.proxied:
            also = ((free_port(), f"127.0.0.1:{session_port}"),) if session_port else ()
            proxy = FaultProxy(f"127.0.0.1:{port}", free_port(), f"{name}-proxy", also=also).start()
            if also:  # servers are told to reach the session port through the proxy too
                config["storage.sessionAdvertisedPort"] = also[0][0]
        config.update(self.storage_overrides)
        config_path = self.workdir / name / "storage.yaml"
        config_path.write_text(yaml.safe_dump(config))
        return StorageNode(
            name=name,
            command=[str(BIN / "waltz-storage")],
            config_path=config_path,
            log_path=self.workdir / name / "storage.log",
            ready_marker="waltz-storage ready",
            new_session=self.detach,
            port=port,
            admin_port=admin_port,
            metrics_port=metrics_port,
            health_port=health_port,
            directory=directory,
            proxy=proxy,
            session_port=session_port,
        )

    def _server_node(self, index: int) -> ServerNode:
        name = f"server-{index}"
        (self.workdir / name).mkdir(parents=True, exist_ok=True)
        port, metrics_port = self._ports(name, 2)
        health_port = free_port() if self.health_ports else 0
        config = {
            **self._common(),
            "server.host": "127.0.0.1",
            "server.port": port,
            "server.metrics.port": metrics_port,
            **({"server.health.port": health_port} if health_port else {}),
            **self.tls_config("server"),
            **self.server_overrides,
        }
        proxy = zookeeper_proxy = None
        if self.proxied:
            proxy = FaultProxy(f"127.0.0.1:{port}", free_port(), f"{name}-proxy").start()
            zookeeper_proxy = FaultProxy(self.zookeeper, free_port(), f"{name}-zookeeper-proxy").start()
            config["server.advertisedAddress"] = proxy.address
            config["zookeeper.connectString"] = zookeeper_proxy.address
        config_path = self.workdir / name / "server.yaml"
        config_path.write_text(yaml.safe_dump(config))
        return ServerNode(
            name=name,
            command=[str(BIN / "waltz-server")],
            config_path=config_path,
            log_path=self.workdir / name / "server.log",
            ready_marker="waltz-server ready",
            new_session=self.detach,
            port=port,
            metrics_port=metrics_port,
            health_port=health_port,
            proxy=proxy,
            zookeeper_proxy=zookeeper_proxy,
        )

    def proxies(self) -> list[FaultProxy]:
        found = [n.proxy for n in self.storage] + [s.proxy for s in self.servers]
        found += [s.zookeeper_proxy for s in self.servers]
        return [p for p in found if p is not None]

    def pids(self) -> dict[str, int]:
        """Live process ids by name (for memory measurements)."""
        found = {p.name: p.pid for p in [*self.servers, *self.storage] if p.running and p.pid}
        if self.zookeeper_process is not None and self.zookeeper_process.pid is not None:
            found["zookeeper"] = self.zookeeper_process.pid
        return {k: v for k, v in found.items() if v is not None}

