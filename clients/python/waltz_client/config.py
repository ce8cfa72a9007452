"""Client configuration keys (YAML, dotted or nested names) with documented defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_common.config import ZOOKEEPER_KEYS, Config, ConfigError, Key, address_list, boolean, load
from waltz_common.tls import TLS_KEYS, TlsFiles
from waltz_common.zk_security import ZkSecurity

CLIENT_KEYS = (
    Key("client.servers", address_list, (),
        "host:port of one or more Waltz servers (comma-separated or a list): the client learns the cluster "
        "(partitions, owners, limits) and its client id from them and needs no ZooKeeper; empty: use "
        "zookeeper.connectString and cluster.root instead"),
    Key("client.discoveryInterval", int, 2000,
        "with client.servers: ms between GetClusterInfo polls that learn of partition moves (a NOT_READY from "
        "a server asks at once)"),
    Key("client.maxConcurrentTransactions", int, 5,
        "pending appends per partition; submit waits for capacity (original default)"),
    Key("client.longWaitThreshold", int, 5000,
        "ms an append may stay pending before the client sends a flush to detect its loss"),
    Key("client.mountTimeout", float, 10.0,
        "seconds submit waits for a partition to be mounted before WaltzTimeoutError"),
    Key("client.requestTimeout", float, 30.0,
        "seconds for capacity waits, unary calls, flush() and unanswered mounts"),
    Key("client.autoMount", boolean, True,
        "mount every partition at start; false: only those named in mount_partitions()"),
    Key("client.maxRetries", int, -1,
        "re-executions of a context after a failed append or lock failure; -1: unlimited, as the original"),
    Key("client.maxBatchSize", int, 100, "appends per AppendBatch stream message"),
    Key("client.keepaliveTime", int, 60000,
        "ms between gRPC keepalive pings on an idle stream (the server must permit this rate)"),
    Key("client.callbackThread", boolean, True,
        "run application callbacks and context hooks on the client's own thread; false: on its event loop, "
        "which saves two thread hops per batch of them, but then a callback that blocks (I/O, a lock, sleep, "
        "Transaction.data() of another client's transaction, which it cannot fetch there) stalls the whole client"),
)

ALL_KEYS = (*ZOOKEEPER_KEYS, *CLIENT_KEYS, *TLS_KEYS)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Typed view of a validated client configuration."""

    zookeeper_connect_string: str
    zookeeper_session_timeout_s: float
    zookeeper_connect_timeout_s: float
    cluster_root: str
    max_concurrent_transactions: int
    long_wait_threshold_s: float
    mount_timeout_s: float
    request_timeout_s: float
    auto_mount: bool
    max_retries: int
    max_batch_size: int
    keepalive_time_ms: int
    callback_thread: bool
    tls: TlsFiles | None = None
    zookeeper_security: ZkSecurity | None = None
    servers: tuple[str, ...] = ()
    discovery_interval_s: float = 2.0

    @staticmethod
    def of(config: Config | Mapping[str, Any] | str | Path | None, zookeeper_required: bool = True) -> ClientConfig:
        """Validate a Config, a mapping of (dotted or nested) keys, or a YAML file path. ZooKeeper keys are needed
        only when zookeeper_required and client.servers is empty."""
        keys = tuple(dataclasses.replace(k, default="") if k.required else k for k in ALL_KEYS)
        if isinstance(config, str | Path):
            config = load(config, keys)
        elif not isinstance(config, Config):
            config = Config(keys, config or {}, "client config")
        if zookeeper_required and not config["client.servers"]:
            missing = [k for k in ("zookeeper.connectString", "cluster.root") if not config[k]]
            if missing:
                raise ConfigError(f"set client.servers, or {' and '.join(missing)} to find the cluster in ZooKeeper")
        if config["client.discoveryInterval"] < 1:
            raise ValueError("client.discoveryInterval must be at least 1 ms")
        if config["client.maxConcurrentTransactions"] < 1:
            raise ValueError("client.maxConcurrentTransactions must be at least 1")
        if config["client.maxBatchSize"] < 1:
            raise ValueError("client.maxBatchSize must be at least 1")
        return ClientConfig(
            zookeeper_connect_string=config["zookeeper.connectString"],
            zookeeper_session_timeout_s=config["zookeeper.sessionTimeout"] / 1000,
            zookeeper_connect_timeout_s=config["zookeeper.connectTimeout"] / 1000,
            cluster_root=config["cluster.root"],
            max_concurrent_transactions=config["client.maxConcurrentTransactions"],
            long_wait_threshold_s=config["client.longWaitThreshold"] / 1000,
            mount_timeout_s=config["client.mountTimeout"],
            request_timeout_s=config["client.requestTimeout"],
            auto_mount=config["client.autoMount"],
            max_retries=config["client.maxRetries"],
            max_batch_size=config["client.maxBatchSize"],
            keepalive_time_ms=config["client.keepaliveTime"],
            callback_thread=config["client.callbackThread"],
            tls=TlsFiles.from_config(config),
            zookeeper_security=ZkSecurity.from_config(config),
            servers=config["client.servers"],
            discovery_interval_s=config["client.discoveryInterval"] / 1000,
        )
