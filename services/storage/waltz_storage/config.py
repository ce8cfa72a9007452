"""The storage node's configuration keys, with their documented defaults."""

from __future__ import annotations

from waltz_common.config import (
    COUNT,
    PORT_OR_ZERO,
    SECONDS,
    ZOOKEEPER_KEYS,
    Config,
    ConfigError,
    Integer,
    Key,
    text,
)
from waltz_common.port_guard import limit_keys
from waltz_common.tls import TLS_KEYS

MIB = 1024 * 1024

STORAGE_KEYS: tuple[Key, ...] = (
    *ZOOKEEPER_KEYS,
    Key(
        "storage.host",
        text,
        "127.0.0.1",
        "bind address, and the host of this node's identity host:port (as in the cluster's replica assignment)",
    ),
    Key("storage.port", PORT_OR_ZERO, doc="port of the storage protocol (WaltzStorage); 0 picks a free port (tests)"),
    Key("storage.admin.port", PORT_OR_ZERO, doc="port of the admin protocol (WaltzStorageAdmin); 0 picks a free port"),
    Key(
        "storage.sessionPort",
        PORT_OR_ZERO,
        0,
        "port of the framed Session transport: the storage protocol's Session stream as length-prefixed protobuf "
        "frames on TCP, under the same TLS and cluster-key rules as storage.port and about a third of a gRPC "
        "stream's CPU per message; a node advertises it in its answer to Open and servers then use it "
        "(storage.useSessionPort). 0: off (the gRPC stream on storage.port serves, as always)",
    ),
    Key(
        "storage.sessionAdvertisedPort",
        PORT_OR_ZERO,
        0,
        "the port servers are told to reach storage.sessionPort at, on the host of the node's connect string, when a "
        "proxy or port mapping puts it elsewhere; 0: storage.sessionPort itself",
    ),
    Key("storage.metrics.port", PORT_OR_ZERO, 0, "Prometheus HTTP port serving /metrics; 0 disables it"),
    Key(
        "storage.health.port",
        PORT_OR_ZERO,
        0,
        "plaintext port serving only grpc.health.v1, for probes that cannot present a client certificate "
        "(kubelet's) when TLS is on; 0: none (health is on both other ports as always)",
    ),
    Key("storage.directory", text, doc="the storage directory: control file and one directory per partition"),
    Key("storage.segment.size.threshold", COUNT, 1_000_000_000, "bytes after which a partition rolls to a new segment"),
    Key("storage.maxRecordBytes", COUNT, 16 * MIB, "largest transaction data accepted in one record, bytes"),
    Key("storage.maxBatchBytes", COUNT, 64 * MIB, "largest append batch (records as encoded on disk), bytes"),
    Key(
        "storage.scrub.bytesPerSecond",
        Integer(0),
        2 * MIB,
        "background scrubbing: how many bytes of records per second the node re-reads and checks, so damage "
        "is found and repaired before a restart needs the data; 0 turns scrubbing off",
    ),
    Key(
        "storage.scrub.intervalSeconds",
        SECONDS,
        3600.0,
        "a scrubbing pass over every partition starts at most this often (a pass takes as long as the "
        "partitions' bytes at storage.scrub.bytesPerSecond, if longer)",
    ),
    Key("storage.shutdownGraceSeconds", SECONDS, 10.0, "on SIGTERM, how long in-flight requests may take to finish"),
    *limit_keys("storage", "each of storage.port and storage.admin.port"),
    *TLS_KEYS,
)


def check(config: Config) -> None:
    """Raise ConfigError for values each valid alone (types and ranges are the keys' own) but not together."""
    if config["storage.maxRecordBytes"] > config["storage.maxBatchBytes"]:
        raise ConfigError(f"{config.source}: storage.maxRecordBytes must not exceed storage.maxBatchBytes")
