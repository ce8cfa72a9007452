"""The store layer's configuration keys and the settings object built from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from waltz_common.config import COUNT, POSITIVE_SECONDS, Config, Key, boolean

STORE_KEYS: tuple[Key, ...] = (
    Key("storage.initialRetryInterval", COUNT, 100, "first wait before reconnecting to a storage node, milliseconds"),
    Key("storage.maxRetryInterval", COUNT, 20000, "longest wait between reconnects or store sessions, milliseconds"),
    Key("storage.checkpointInterval", COUNT, 250000, "transactions after which a new store session is forced"),
    Key("storage.requestTimeoutSeconds", POSITIVE_SECONDS, 30.0,
        "how long one storage request may take before it fails"),
    Key("storage.catchUpBatchSize", COUNT, 500, "records per read when a replica catches up from another"),
    Key("storage.replicaLagTimeout", COUNT, 5000,
        "milliseconds a replica may stay behind a batch a quorum acknowledged before the store session ends "
        "without it (it catches up in the next); bounds how long a hung replica holds appends back"),
    Key("storage.maxReplicaBacklogBytes", COUNT, 33554432,
        "bytes of store batches sent to one replica and not acknowledged yet beyond which the partition's next batch "
        "waits for it (a replica further behind than a quorum, such as one far away, holds the partition back only "
        "past this; 32 MiB is 8 batches of storage.maxBatchBytes' default); at least one batch always goes"),
    Key("storage.keepaliveTime", COUNT, 5000,
        "milliseconds without data on a storage connection before the server pings the node; a ping not answered "
        "within as long again ends the connection (a node gone without a reset is noticed while idle too)"),
    Key("storage.damageCheckIntervalSeconds", POSITIVE_SECONDS, 10.0,
        "how often an open store session asks its replicas for damaged records (found by a read or by scrubbing); "
        "damage ends the session, and the next one's recovery repairs it from an intact replica"),
    Key("storage.useSessionPort", boolean, True,
        "use a storage node's framed Session port (its storage.sessionPort, advertised in its answer to Open) "
        "instead of the gRPC stream on its storage port: the same messages for about a third of the CPU; the gRPC "
        "stream stays in use when the node has none or the port cannot be reached"),
)


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What the store layer needs from the configuration (defaults as STORE_KEYS)."""

    initial_retry_interval_s: float = 0.1
    max_retry_interval_s: float = 20.0
    checkpoint_interval: int = 250_000
    request_timeout_s: float = 30.0
    catch_up_batch_size: int = 500
    replica_lag_timeout_s: float = 5.0
    max_replica_backlog_bytes: int = 32 * 1024 * 1024
    keepalive_time_s: float = 5.0
    damage_check_interval_s: float = 10.0
    use_session_port: bool = True

    def __post_init__(self) -> None:
        if self.initial_retry_interval_s <= 0 or self.max_retry_interval_s < self.initial_retry_interval_s:
            raise ValueError("storage retry intervals must be positive, initial <= max")
        if (
            self.checkpoint_interval < 1
            or self.catch_up_batch_size < 1
            or self.request_timeout_s <= 0
            or self.replica_lag_timeout_s <= 0
            or self.max_replica_backlog_bytes < 1
            or self.keepalive_time_s <= 0
            or self.damage_check_interval_s <= 0
        ):
            raise ValueError(
                "storage.checkpointInterval, catchUpBatchSize, requestTimeoutSeconds, replicaLagTimeout, "
                "maxReplicaBacklogBytes and keepaliveTime must be positive"
            )

    @staticmethod
    def from_config(config: Config | Mapping[str, Any]) -> StoreSettings:
        return StoreSettings(
            initial_retry_interval_s=config["storage.initialRetryInterval"] / 1000.0,
            max_retry_interval_s=config["storage.maxRetryInterval"] / 1000.0,
            checkpoint_interval=config["storage.checkpointInterval"],
            request_timeout_s=config["storage.requestTimeoutSeconds"],
            catch_up_batch_size=config["storage.catchUpBatchSize"],
            replica_lag_timeout_s=config["storage.replicaLagTimeout"] / 1000.0,
            max_replica_backlog_bytes=config["storage.maxReplicaBacklogBytes"],
            keepalive_time_s=config["storage.keepaliveTime"] / 1000.0,
            damage_check_interval_s=config["storage.damageCheckIntervalSeconds"],
            use_session_port=config["storage.useSessionPort"],
        )


class Backoff:
    """Exponential retry delays from the initial to the max interval; reset after a success."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._initial = initial_s
        self._max = max_s
        self._next = initial_s

    @classmethod
    def of(cls, settings: StoreSettings) -> Backoff:
        """The store's retries: storage.initialRetryInterval up to storage.maxRetryInterval."""
        return cls(settings.initial_retry_interval_s, settings.max_retry_interval_s)

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._max)
        return delay

    def reset(self) -> None:
        self._next = self._initial
