"""The server's configuration keys with their defaults, and the settings a partition needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from waltz_common.config import (
    COUNT,
    PORT,
    PORT_OR_ZERO,
    SECONDS,
    WILDCARD_HOSTS,
    ZOOKEEPER_KEYS,
    Config,
    ConfigError,
    Integer,
    Key,
    boolean,
    optional_address,
    split_address,
    text,
)
from waltz_common.port_guard import limit_keys
from waltz_common.tls import TLS_KEYS
from waltz_server.liveness import LivenessSettings
from waltz_server.store.settings import STORE_KEYS
from waltz_server.validation import DEFAULT_MAX_LOCKS_PER_APPEND

DEFAULT_CACHE_BUDGET = 134217728

SERVER_KEYS = (
    Key("server.host", text, "127.0.0.1",
        "address to listen on, and to advertise to clients unless server.advertisedAddress is set (which a "
        "wildcard such as 0.0.0.0 or :: requires)"),
    Key("server.port", PORT, doc="gRPC port for clients"),
    Key("server.advertisedAddress", optional_address, "",
        "host:port that clients are told to reach this server at (its ZooKeeper descriptor), when it differs from "
        "where it listens (a proxy, a NAT, a Kubernetes Service); required when server.host is a wildcard "
        "(0.0.0.0, ::); empty: server.host and the bound port"),
    Key("server.metrics.port", PORT_OR_ZERO, 0, "Prometheus /metrics HTTP port (0: off)"),
    Key("server.health.port", PORT_OR_ZERO, 0,
        "plaintext port serving only grpc.health.v1, for probes that cannot present a client certificate "
        "(kubelet's) when TLS is on; 0: none (health is on server.port as always)"),
    Key("server.optimisticLockTableSize", COUNT, 30000, "slots of each partition's hashed lock table"),
    Key("server.maxLocksPerAppend", COUNT, DEFAULT_MAX_LOCKS_PER_APPEND,
        "write, read and append locks one append may carry together; one with more is rejected INVALID (clients "
        "learn it from GetClusterInfo's limits)"),
    Key("server.appendQueueSize", COUNT, 2000, "appends queued per partition before clients are held back"),
    Key("server.maxTransactionBytes", COUNT, 1048576, "largest transaction data accepted, bytes"),
    Key("server.resendWindow", COUNT, 10000,
        "transactions per partition whose ReqIds the server remembers (read back from the log's tail when a "
        "partition opens), so that an append re-sent with the ReqId of one of them is answered ALREADY_COMMITTED "
        "with its id instead of committing twice"),
    Key("server.feedCacheSize", COUNT, 100000, "recent committed transaction headers kept per partition"),
    Key("server.transactionDataCacheSize", COUNT, 67108864, "recent transaction data cached per partition, bytes"),
    Key("server.cacheBudgetBytes", COUNT, DEFAULT_CACHE_BUDGET,
        "memory for the feed and transaction-data caches of all the partitions this server owns together, "
        "bytes (estimated); over it, the largest caches drop their oldest entries"),
    Key("server.feedBatchSize", COUNT, 1000, "feed entries per FeedDataBatch message"),
    Key("server.feedFetchSize", COUNT, 5000, "headers read from the store at a time for far-behind feeds"),
    Key("server.feedInlineDataMaxBytes", Integer(0), 4096,
        "largest transaction data the feed carries inline to clients that ask for it (MountRequest."
        "inline_data_max_bytes), bytes; the last 5 x server.feedBatchSize transactions' are kept for them "
        "(built once per committed batch, only while a feed of the partition asks); 0: never"),
    Key("server.streamQueueSize", COUNT, 64, "messages queued for one client stream before feeds wait"),
    Key("server.readBatchSize", COUNT, 5000, "records per ReadTransactions message (upper bound)"),
    Key("server.readBatchBytes", COUNT, 1048576,
        "bytes of records per ReadTransactions message (upper bound; a message carries at least one record)"),
    Key("server.shutdownGraceSeconds", SECONDS, 10.0, "how long in-flight calls may finish on SIGTERM"),
    *limit_keys("server", "server.port"),
    Key("server.peerDetection", boolean, True,
        "watch the other servers over their client ports (grpc.health.v1 Check) and move a dead server's partitions "
        "as soon as it is found dead (server.peerRefusedConfirm, server.peerTimeout), without waiting for "
        "ZooKeeper to expire its session; false: only the session's expiry moves them"),
    Key("server.peerProbeInterval", COUNT, 250,
        "milliseconds between two probes of each peer server (at most half of server.peerRefusedConfirm)"),
    Key("server.peerRefusedConfirm", COUNT, 500,
        "milliseconds a peer's connections must keep being refused or reset (at least two probes, none "
        "answered) before it is dead: a killed process"),
    Key("server.peerTimeout", COUNT, 3000,
        "milliseconds without any answer from a peer before it is dead: a frozen process or a cut network; "
        "longer than any pause a live server may take (a 1 s stop-the-world pause, a busy machine)"),
    Key("server.peerRejoin", COUNT, 2000,
        "milliseconds a dead peer must answer every probe before it counts as alive again"),
    Key("storage.maxBatchSize", COUNT, 500, "appends per store batch (one request per replica)"),
    Key("storage.maxBatchBytes", COUNT, 4194304, "transaction bytes per store batch"),
    Key("storage.maxBatchesInFlight", COUNT, 1,
        "store batches of a partition at its replicas, not committed yet; more overlap round trips to "
        "distant storage nodes, 1 batches the most (least CPU per append)"),
)


def liveness_settings(config: Config | dict[str, Any]) -> LivenessSettings:
    """The failure detector's settings from the server.peer* keys (each at least 1 ms by its kind; how they
    must relate to each other is LivenessSettings' check)."""
    try:
        return LivenessSettings(
            enabled=config["server.peerDetection"],
            probe_interval_s=config["server.peerProbeInterval"] / 1000.0,
            refused_confirm_s=config["server.peerRefusedConfirm"] / 1000.0,
            timeout_s=config["server.peerTimeout"] / 1000.0,
            rejoin_s=config["server.peerRejoin"] / 1000.0,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check(config: Config) -> None:
    """Raise ConfigError for values each valid alone (types and ranges are the keys' own) but not together."""
    host = config["server.host"].strip()
    if host in WILDCARD_HOSTS and not config["server.advertisedAddress"]:
        raise ConfigError(
            f"{config.source}: server.host {host!r} listens on every interface, which is no address a client can "
            "connect to: set server.advertisedAddress to the host:port clients should use"
        )


def advertised(config: Config, bound_port: int) -> tuple[str, int]:
    """(host, port) to register in ZooKeeper: server.advertisedAddress when set, else where the server listens."""
    address = config["server.advertisedAddress"]
    return split_address(address) if address else (config["server.host"], bound_port)


def all_keys() -> tuple[Key, ...]:
    """Every key `waltz-server` accepts: ZooKeeper, server, then the store's own."""
    mine = ZOOKEEPER_KEYS + SERVER_KEYS + TLS_KEYS
    names = {k.name for k in mine}
    return mine + tuple(k for k in STORE_KEYS if k.name not in names)


@dataclass(frozen=True, slots=True)
class PartitionSettings:
    """What a Partition and its feeds need from the configuration."""

    lock_table_size: int = 30000
    append_queue_size: int = 2000
    max_transaction_bytes: int = 1048576
    feed_cache_size: int = 100000
    data_cache_bytes: int = 67108864
    feed_batch_size: int = 1000
    feed_fetch_size: int = 5000
    max_batch_size: int = 500
    max_batch_bytes: int = 4194304
    max_batches_in_flight: int = 1
    read_batch_size: int = 5000
    read_batch_bytes: int = 1048576
    resend_window: int = 10000
    max_locks_per_append: int = DEFAULT_MAX_LOCKS_PER_APPEND
    feed_inline_max_bytes: int = 4096

    def __post_init__(self) -> None:
        small = [name for name, value in self._sizes() if value < 1]
        if small:
            raise ConfigError(f"these settings must be at least 1: {', '.join(small)}")

    def _sizes(self) -> list[tuple[str, int]]:
        return [
            ("server.optimisticLockTableSize", self.lock_table_size),
            ("server.appendQueueSize", self.append_queue_size),
            ("server.maxTransactionBytes", self.max_transaction_bytes),
            ("server.feedCacheSize", self.feed_cache_size),
            ("server.transactionDataCacheSize", self.data_cache_bytes),
            ("server.feedBatchSize", self.feed_batch_size),
            ("server.feedFetchSize", self.feed_fetch_size),
            ("storage.maxBatchSize", self.max_batch_size),
            ("storage.maxBatchBytes", self.max_batch_bytes),
            ("storage.maxBatchesInFlight", self.max_batches_in_flight),
            ("server.readBatchSize", self.read_batch_size),
            ("server.readBatchBytes", self.read_batch_bytes),
            ("server.resendWindow", self.resend_window),
            ("server.maxLocksPerAppend", self.max_locks_per_append),
        ]

    @staticmethod
    def from_config(config: Config | dict[str, Any]) -> PartitionSettings:
        c = config
        return PartitionSettings(
            lock_table_size=c["server.optimisticLockTableSize"],
            append_queue_size=c["server.appendQueueSize"],
            max_transaction_bytes=c["server.maxTransactionBytes"],
            feed_cache_size=c["server.feedCacheSize"],
            data_cache_bytes=c["server.transactionDataCacheSize"],
            feed_batch_size=c["server.feedBatchSize"],
            feed_fetch_size=c["server.feedFetchSize"],
            max_batch_size=c["storage.maxBatchSize"],
            max_batch_bytes=c["storage.maxBatchBytes"],
            max_batches_in_flight=c["storage.maxBatchesInFlight"],
            read_batch_size=c["server.readBatchSize"],
            read_batch_bytes=c["server.readBatchBytes"],
            resend_window=c["server.resendWindow"],
            max_locks_per_append=c["server.maxLocksPerAppend"],
            feed_inline_max_bytes=c["server.feedInlineDataMaxBytes"],
        )
