"""A local cluster for development (`waltz dev`) whose data, and ports, can be kept between runs.

A data directory holds the ZooKeeper data, every storage node's files and ``waltz-dev.json``, the
shape of the cluster and the ports its processes listen on. A second run on the same directory
starts the same cluster again: the storage nodes must listen on their old ports (a storage node's
identity in ZooKeeper is its host:port), ZooKeeper and the servers take their old ports when free
and new ones otherwise (a client finds them through ZooKeeper, so only ZooKeeper's connect string
may change, and it is printed again).
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kazoo.client import KazooClient

from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster, free_port
from waltz_common.testing.zookeeper import ZooKeeperProcess

STATE_FILE = "waltz-dev.json"
STATE_VERSION = 1


class DevClusterError(RuntimeError):
    """The data directory cannot be used as asked (another shape, a port taken, not a dev directory)."""


@dataclass
class DevState:
    """What a data directory remembers: the cluster's shape and each process's ports by name."""

    cluster_root: str
    partitions: int
    storage_nodes: int
    servers: int
    zookeeper_port: int = 0
    ports: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"version": STATE_VERSION, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> DevState:
        try:
            data: dict[str, Any] = json.loads(text)
            if data.pop("version", None) != STATE_VERSION:
                raise ValueError(f"not version {STATE_VERSION}")
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise DevClusterError(f"{where}: not a waltz dev state file: {exc}") from None


def plan(saved: DevState | None, *, partitions: int | None, storage_nodes: int | None, servers: int | None,
         cluster_root: str | None) -> DevState:
    """The cluster to run: the one saved (options may only repeat its shape; servers may change) or a new one."""
    if saved is None:
        return DevState(cluster_root=cluster_root or "/waltz/dev", partitions=partitions or 2,
                        storage_nodes=storage_nodes or 3, servers=servers or 1)
    for option, asked, kept in (("--partitions", partitions, saved.partitions),
                                ("--storage-nodes", storage_nodes, saved.storage_nodes),
                                ("--root", cluster_root, saved.cluster_root)):
        if asked is not None and asked != kept:
            raise DevClusterError(f"{option} {asked}: the kept data holds a cluster with {kept}; "
                                  "leave the option out, or use another --data directory")
    return DevState(cluster_root=saved.cluster_root, partitions=saved.partitions, storage_nodes=saved.storage_nodes,
                    servers=servers or saved.servers, zookeeper_port=saved.zookeeper_port, ports=dict(saved.ports))


def choose_ports(
    name: str, count: int, saved: list[int] | None, free: set[int], *, must_keep: bool
) -> list[int] | None:
    """The saved ports when all are free; None to take new ones; an error when they must be kept but are taken."""
    if not saved or len(saved) != count:
        return None
    if all(port in free for port in saved):
        return list(saved)
    if must_keep:
        taken = [port for port in saved if port not in free]
        raise DevClusterError(f"{name} must listen on its port(s) {taken} again (its identity in the cluster), "
                              "but something else holds them now; stop that, or use another --data directory")
    return None


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the services bind: TIME_WAIT is no obstacle
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DevCluster(LocalCluster):
    """A LocalCluster in a data directory, created on the first run and started again on later ones."""

    def __init__(self, workdir: str | Path, state: DevState, resume: bool) -> None:
        super().__init__(workdir, storage_nodes=state.storage_nodes, servers=state.servers,
                         partitions=state.partitions, cluster_root=state.cluster_root, name="dev", detach=True)
        self.state = state
        self.resume = resume
        kept = state.zookeeper_port if state.zookeeper_port and port_is_free(state.zookeeper_port) else None
        self.zookeeper_process = ZooKeeperProcess(
            self.workdir / "zookeeper", port=kept or free_port(), new_session=True
        )

    @classmethod
    def open(cls, workdir: str | Path, **options: Any) -> DevCluster:
        """The dev cluster of workdir: the kept one when workdir holds a state file, else a new one."""
        workdir = Path(workdir)
        state_path = workdir / STATE_FILE
        saved = DevState.from_json(state_path.read_text(), str(state_path)) if state_path.exists() else None
        if saved is None and workdir.exists() and any(workdir.iterdir()):
            raise DevClusterError(f"{workdir} is neither empty nor a waltz dev data directory (no {STATE_FILE})")
        return cls(workdir, plan(saved, **options), resume=saved is not None)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """An application's configuration: the servers' addresses (client.servers), no ZooKeeper (an application
        needs none; docs/client-guide.md), and the TLS keys when the cluster runs TLS."""
        return {"client.servers": ",".join(server.address for server in self.servers),
                **self.tls_config("application"), **overrides}

    def write_cli_config(self, name: str = "cli.yaml") -> Path:
        """The `waltz -c` file of the admin commands: ZooKeeper (which they read), and the servers (client.servers),
        which `waltz cluster verify` then expects to be up."""
        path = self.workdir / name
        path.write_text(yaml.safe_dump({"zookeeper.connectString": self.zookeeper, "cluster.root": self.paths.root,
                                        **self.client_config()}, sort_keys=False))
        return path

    def _set_up(self, zk: KazooClient) -> None:
        if not self.resume:
            super()._set_up(zk)
            return
        params = zkmeta.store_params(zk, self.paths)
        self.cluster_key = params.cluster_key
        known = cluster_admin.storage_nodes(zk, self.paths)
        for index in range(self.num_storage):
            node = self._storage_node(index)
            if node.connect_string not in known:
                raise DevClusterError(f"{node.connect_string} ({node.name}) is not a storage node of the kept cluster")
            self.storage.append(node)

    def _ports(self, name: str, count: int) -> list[int]:
        saved = self.state.ports.get(name)
        free = {port for port in saved or [] if port_is_free(port)}
        kept = choose_ports(name, count, saved, free, must_keep=self.resume and name.startswith("storage"))
        ports = kept or [free_port() for _ in range(count)]
        self.state.ports[name] = ports
        return ports

    def save_state(self) -> None:
        """Remember the shape and the ports now in use (after a successful start)."""
        self.state.zookeeper_port = int(self.zookeeper.rsplit(":", 1)[1])
        self.state.ports = {k: v for k, v in self.state.ports.items()
                            if k in {p.name for p in [*self.storage, *self.servers]}}
        path = self.workdir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.state.to_json())
        tmp.replace(path)
