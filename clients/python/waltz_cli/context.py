"""The connection context shared by commands: ZooKeeper (lazy), cluster paths, timeouts, output mode."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from kazoo.client import KazooClient

from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_cli.errors import CliError, UsageError, rpc_message
from waltz_cli.guards import PartitionView, ReplicaState
from waltz_common import cluster_admin, tls, zk_security
from waltz_common import config as cfg
from waltz_common import zk as zkmeta
from waltz_common.tls import TLS_KEYS, TlsFiles
from waltz_common.zk_security import ZkSecurity

CLI_FILE_KEYS = (
    *(dataclasses.replace(k, default=None) if k.required else k for k in cfg.ZOOKEEPER_KEYS),
    cfg.Key("client.servers", cfg.address_list, (), "Waltz servers the client commands ask instead of ZooKeeper"),
    *TLS_KEYS,
)
"""The CLI file: ZooKeeper keys (needed by every command but the client ones with client.servers), TLS keys."""


def cli_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The CLI file keys set by WALTZ_* variables (WALTZ_ZOOKEEPER_CONNECT_STRING, WALTZ_CLUSTER_ROOT,
    WALTZ_CLIENT_SERVERS, WALTZ_TLS_CERT_FILE, ...: the client's names, waltz_client.config.env_name); empty values
    and other variables are ignored."""
    from waltz_client.config import env_name

    names = {env_name(k.name): k.name for k in CLI_FILE_KEYS}
    return {names[variable]: value for variable, value in environ.items() if variable in names and value.strip()}


@dataclass
class Context:
    """Where the cluster is and how long to wait; opens ZooKeeper only when a command needs it."""

    connect_string: str | None
    root: str | None
    connect_timeout_s: float = 10.0
    session_timeout_s: float = 30.0
    rpc_timeout_s: float = 10.0
    as_json: bool = False
    show_progress: bool | None = None
    tls: TlsFiles | None = None
    zk_security: ZkSecurity | None = None
    zk_security_keys: dict[str, str] = field(default_factory=dict)
    servers: tuple[str, ...] = ()
    _zk: KazooClient | None = field(default=None, repr=False)
    _cluster_info: server_pb2.ClusterInfoResponse | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Context:
        """Build from the flags (--zookeeper, --root, --server-addresses, --tls-*), -c CLI.yaml and the WALTZ_*
        variables of its keys (environ; None: os.environ), in that order of precedence."""
        env = cli_environment(os.environ if environ is None else environ)
        flags: dict[str, Any] = {name: value for name, value in (
            ("zookeeper.connectString", args.zookeeper), ("cluster.root", args.root),
            ("client.servers", args.server_addresses), ("tls.certFile", args.tls_cert),
            ("tls.keyFile", args.tls_key), ("tls.caFile", args.tls_ca)) if value}
        if args.config:
            conf = cfg.load(args.config, CLI_FILE_KEYS)
            given = {name: conf[name] for name in conf.given}
            if env or flags:
                conf = cfg.Config(CLI_FILE_KEYS, {**env, **given, **flags},
                                  f"{args.config} and the WALTZ_* environment" if env else str(args.config))
        else:
            conf = cfg.Config(CLI_FILE_KEYS, {**env, **flags}, "the WALTZ_* environment")
        servers = conf["client.servers"]
        connect, root = conf["zookeeper.connectString"], conf["cluster.root"]
        cert, key, ca = conf["tls.certFile"], conf["tls.keyFile"], conf["tls.caFile"]
        security = ZkSecurity.from_config(conf)
        security_keys = {k: conf[k] for k in zk_security.KEY_NAMES if conf[k] is not None}
        # without a file that sets it, --timeout bounds the connection to ZooKeeper too
        explicit = bool(args.config or {"zookeeper.connectTimeoutSeconds", "zookeeper.connectTimeout"} & conf.given)
        connect_timeout = cfg.zookeeper_connect_timeout_s(conf) if explicit else args.timeout
        session_timeout = cfg.zookeeper_session_timeout_s(conf)
        return cls(
            connect_string=connect,
            root=root,
            connect_timeout_s=connect_timeout,
            session_timeout_s=session_timeout,
            rpc_timeout_s=args.timeout,
            as_json=args.json,
            show_progress=args.progress,
            tls=TlsFiles.of(cert, key, ca, "TLS (--tls-cert/--tls-key/--tls-ca or tls.* in the CLI file)"),
            zk_security=security,
            zk_security_keys=security_keys,
            servers=tuple(servers),
        )

    @property
    def zk(self) -> KazooClient:
        """The started ZooKeeper client (connects on first use)."""
        if self._zk is None:
            if not self.connect_string:
                raise UsageError("no ZooKeeper given: use -c CLI.yaml or --zookeeper HOST:PORT --root /path")
            self.paths  # a bad root is reported before waiting for ZooKeeper  # noqa: B018
            self._zk = zkmeta.connect(
                self.connect_string, self.connect_timeout_s, self.session_timeout_s, self.zk_security
            )
        return self._zk

    @property
    def paths(self) -> zkmeta.ZkPaths:
        if not self.root:
            raise UsageError("no cluster root given: use -c CLI.yaml (cluster.root) or --root /path")
        return zkmeta.ZkPaths(self.root)

    def store_params(self) -> metadata_pb2.StoreParams:
        return zkmeta.store_params(self.zk, self.paths)

    def num_partitions(self) -> int:
        if self.servers:
            return self.cluster_info().num_partitions
        return self.store_params().num_partitions

    def cluster_info(self) -> server_pb2.ClusterInfoResponse:
        """GetClusterInfo from the first of --server-addresses that answers (once per command)."""
        if self._cluster_info is None:
            failures = []
            for server in self.servers:
                channel = tls.channel(server, self.tls)
                try:
                    stub = server_pb2_grpc.WaltzServerStub(channel)
                    request = server_pb2.ClusterInfoRequest()
                    self._cluster_info = stub.GetClusterInfo(request, timeout=self.rpc_timeout_s)
                    break
                except grpc.RpcError as exc:
                    failures.append(rpc_message(exc, f"server {server}"))
                finally:
                    channel.close()
            else:
                raise CliError("no server of --server-addresses answered: " + "; ".join(failures or ["none given"]))
        return self._cluster_info

    def partitions(self, text: str | None) -> list[int]:
        """Parse a range like '0-6,8' against the cluster; None means every partition."""
        count = self.num_partitions()
        if text is None:
            return list(range(count))
        try:
            return cluster_admin.parse_partitions(text, count)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def partition_view(self, partition_id: int) -> PartitionView:
        """What ZooKeeper holds about a partition's store session and replicas (for the guards)."""
        read = zkmeta.read(self.zk, self.paths.partition_metadata(partition_id), metadata_pb2.PartitionMetadata)
        session_id, states = -1, {}
        if read is not None:
            session_id = read[0].session_id
            states = {
                e.replica_id.storage_node_connect_string: ReplicaState(
                    e.replica_state.session_id, e.replica_state.closing_high_water_mark
                )
                for e in read[0].replica_states
            }
        assigned = cluster_admin.replica_assignments(self.zk, self.paths)
        holders = frozenset(node for node, held in assigned.items() if partition_id in held)
        return PartitionView(partition_id, session_id, states, holders)

    def tls_config(self) -> dict[str, str]:
        """The tls.* keys of a client configuration that uses the CLI's certificate (empty without TLS)."""
        return {} if self.tls is None else self.tls.as_config()

    def zookeeper_security_config(self) -> dict[str, str]:
        """The zookeeper.tls.*, zookeeper.auth and zookeeper.acl keys of the CLI file, for a client it starts."""
        return dict(self.zk_security_keys)

    def admin_port(self, node: str) -> int:
        """The registered admin port of a storage node (its host:port connect string)."""
        nodes = cluster_admin.storage_nodes(self.zk, self.paths)
        if node not in nodes:
            known = ", ".join(sorted(nodes)) or "none"
            raise UsageError(f"storage node {node} is not in the cluster (registered: {known})")
        port = nodes[node][1]
        if port <= 0:
            raise UsageError(f"storage node {node} has no admin port registered")
        return port

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
