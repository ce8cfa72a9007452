"""Client configuration keys (YAML, dotted or nested names) with documented defaults.

Durations are in seconds (floats). Three keys used to be in milliseconds and are still accepted under their old
names, with a DeprecationWarning and a log warning: DEPRECATED_MS_KEYS maps each to its seconds-named replacement.

Every key can also come from the environment: ``WALTZ_`` and the key's name in upper snake case
(``client.servers`` -> ``WALTZ_CLIENT_SERVERS``, ``client.mountTimeout`` -> ``WALTZ_CLIENT_MOUNT_TIMEOUT``,
``tls.caFile`` -> ``WALTZ_TLS_CA_FILE``; env_name()). A key the configuration passed to the client sets wins over
its variable; a variable fills in a key the configuration leaves out; the default applies when neither sets it.
``WALTZ_CLIENT_CONFIG`` names a YAML file, the configuration of a client given none. Any other ``WALTZ_CLIENT_*``,
``WALTZ_TLS_*`` or ``WALTZ_ZOOKEEPER_*`` variable that names no key is logged as a warning (with the closest key's
variable) and ignored: an application's own variables of that shape must not stop it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waltz_client.errors import ConfigError
from waltz_common.config import (
    COUNT,
    POSITIVE_SECONDS,
    SECONDS,
    ZOOKEEPER_KEYS,
    Config,
    Integer,
    Key,
    _flatten,
    address_list,
    boolean,
    did_you_mean,
    load,
    seconds_or_deprecated_ms,
)
from waltz_common.config import ConfigError as CommonConfigError
from waltz_common.tls import TLS_KEYS, TlsFiles
from waltz_common.zk_security import ZkSecurity

ENV_PREFIX = "WALTZ_"
ENV_CONFIG_FILE = "WALTZ_CLIENT_CONFIG"
"""The variable naming the YAML file of a client given no configuration (config=None)."""
_KEY_PREFIXES = ("WALTZ_CLIENT_", "WALTZ_TLS_", "WALTZ_ZOOKEEPER_")

log = logging.getLogger(__name__)
_warned: set[str] = set()  # the unknown variables already warned of: once per process, not once per client

CLIENT_KEYS = (
    Key("client.servers", address_list, (),
        "host:port of one or more Waltz servers (comma-separated or a list): the client learns the cluster "
        "(partitions, owners, limits) and its client id from them and needs no ZooKeeper; empty: use "
        "zookeeper.connectString and cluster.root instead"),
    Key("client.discoveryIntervalSeconds", POSITIVE_SECONDS, 2.0,
        "with client.servers: seconds between GetClusterInfo polls that learn of partition moves (a NOT_READY "
        "from a server asks at once)"),
    Key("client.maxConcurrentTransactions", COUNT, 20,
        "appends in flight per partition (sent, not yet committed); submit waits for a free one. More pipelines "
        "more (throughput) but builds each transaction on staler state (lock failures under contention); 20 was "
        "measured the best of 1-50 (bench/inflight.py, docs/client-guide.md); the original's default was 5"),
    Key("client.inlineDataMaxBytes", Integer(0), 4096,
        "largest transaction data of other clients the client asks the feed to carry inline (MountRequest."
        "inline_data_max_bytes), bytes, once the application read such data in apply (Transaction.data()): it is "
        "then applied without a fetch (a round trip to the server); capped by the server's "
        "server.feedInlineDataMaxBytes; 0: never ask (fetch every other client's data)"),
    Key("client.longWaitThresholdSeconds", POSITIVE_SECONDS, 5.0,
        "seconds an append may stay pending before the client sends a flush to detect its loss"),
    Key("client.mountTimeout", POSITIVE_SECONDS, 10.0,
        "seconds submit (and wait_mounted) waits for a partition to be mounted before WaltzTimeoutError; a mount "
        "completes only once the catch-up feed (every transaction after the client's high-water mark) is applied, "
        "and goes on after the timeout: it bounds the wait, not the mount"),
    Key("client.requestTimeout", POSITIVE_SECONDS, 30.0,
        "seconds for capacity waits, unary calls, flush(), unanswered mounts, and for finding a server at start "
        "(UnavailableError)"),
    Key("client.closeTimeout", SECONDS, 10.0,
        "seconds close() (and leaving `with`/`async with`) waits for the transactions in flight to end before it "
        "fails those still pending with WaltzClosedError; 0: do not wait (close(flush=False) does the same)"),
    Key("client.autoMount", boolean, True,
        "mount every partition at start; false: only those named in mount_partitions()"),
    Key("client.maxRetries", Integer(-1), -1,
        "re-executions of a context after a failed append or lock failure; -1: unlimited, as the original"),
    Key("client.maxBatchSize", COUNT, 100, "appends per AppendBatch stream message"),
    Key("client.keepaliveTimeSeconds", POSITIVE_SECONDS, 60.0,
        "seconds between gRPC keepalive pings on an idle stream (the server must permit this rate)"),
    Key("client.callbackThread", boolean, True,
        "run application callbacks and context hooks on the client's own thread; false: on its event loop, "
        "which saves two thread hops per batch of them, but then a callback that blocks (I/O, a lock, sleep, "
        "Transaction.data() of another client's transaction, which it cannot fetch there) stalls the whole client"),
    Key("client.discoveryInterval", COUNT, None,
        "deprecated: milliseconds; use client.discoveryIntervalSeconds"),
    Key("client.longWaitThreshold", COUNT, None,
        "deprecated: milliseconds; use client.longWaitThresholdSeconds"),
    Key("client.keepaliveTime", COUNT, None,
        "deprecated: milliseconds; use client.keepaliveTimeSeconds"),
)

DEPRECATED_MS_KEYS = {
    "client.discoveryInterval": "client.discoveryIntervalSeconds",
    "client.longWaitThreshold": "client.longWaitThresholdSeconds",
    "client.keepaliveTime": "client.keepaliveTimeSeconds",
}
"""Old key (milliseconds) -> its replacement (seconds)."""

ALL_KEYS = (*ZOOKEEPER_KEYS, *CLIENT_KEYS, *TLS_KEYS)


def env_name(key: str) -> str:
    """The environment variable of a key: client.mountTimeout -> WALTZ_CLIENT_MOUNT_TIMEOUT."""
    return ENV_PREFIX + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).replace(".", "_").upper()


def from_environment(keys: Iterable[Key], environ: Mapping[str, str]) -> dict[str, str]:
    """The keys set by WALTZ_* variables (empty values are ignored). A WALTZ_CLIENT_*, WALTZ_TLS_* or
    WALTZ_ZOOKEEPER_* variable that names no key (other than WALTZ_CLIENT_CONFIG) is logged as a warning, once per
    process, with the closest key's variable, and ignored (other WALTZ_* variables belong to other tools)."""
    names = {env_name(k.name): k.name for k in keys}
    found: dict[str, str] = {}
    for variable, value in environ.items():
        if variable in names:
            if value.strip():
                found[names[variable]] = value
        elif variable.startswith(_KEY_PREFIXES) and variable != ENV_CONFIG_FILE and variable not in _warned:
            _warned.add(variable)
            log.warning("environment: %s names no client configuration key; ignored%s", variable,
                        did_you_mean(variable, names))
    return found


def _merge_environment(config: Config, keys: tuple[Key, ...], environ: Mapping[str, str]) -> Config:
    env = {name: value for name, value in from_environment(keys, environ).items() if name not in config.given}
    if not env:
        return config
    values: dict[str, Any] = dict(env)
    for name, value in env.items():  # name the variable, not the key, when its value is bad
        try:
            values[name] = next(k for k in keys if k.name == name).kind(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"environment: {env_name(name)}: {exc}") from None
    values.update((name, config[name]) for name in config.given)
    return Config(keys, values, f"{config.source} and the WALTZ_* environment")


def _keys() -> tuple[Key, ...]:
    """Every key a client reads, none required (ClientConfig.of says what is missing)."""
    return tuple(dataclasses.replace(k, default="") if k.required else k for k in ALL_KEYS)


def _with_overrides(config: Config | Mapping[str, Any] | str | Path | None,
                    overrides: Mapping[str, Any] | None) -> Config | Mapping[str, Any] | str | Path | None:
    """config with overrides applied (a Config: validated again with the keys it set and the overrides)."""
    if not overrides:
        return config
    changes = _flatten(overrides)
    if isinstance(config, str | Path):
        return load(config, _keys(), changes)
    if isinstance(config, Config):
        return Config(_keys(), {**{name: config[name] for name in config.given}, **changes},
                      f"{config.source} with overrides")
    return {**_flatten(config or {}), **changes}


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
    keepalive_time_s: float
    callback_thread: bool
    tls: TlsFiles | None = None
    zookeeper_security: ZkSecurity | None = None
    servers: tuple[str, ...] = ()
    discovery_interval_s: float = 2.0
    close_timeout_s: float = 10.0
    inline_data_max_bytes: int = 4096

    @staticmethod
    def of(config: Config | Mapping[str, Any] | str | Path | None, zookeeper_required: bool = True,
           environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> ClientConfig:
        """Validate a Config, a mapping of (dotted or nested) keys, or a YAML file path, with overrides (a mapping
        of dotted or nested keys that win over it), filled in from WALTZ_* environment variables (environ; None:
        os.environ). ZooKeeper keys are needed only when zookeeper_required and client.servers is empty. Any
        problem is a ConfigError (a WaltzError and a ValueError). With config None, the YAML file WALTZ_CLIENT_CONFIG
        names (if set) is the configuration."""
        environ = os.environ if environ is None else environ
        if config is None and (path := environ.get(ENV_CONFIG_FILE, "").strip()):
            if not Path(path).is_file():
                raise ConfigError(f"environment: {ENV_CONFIG_FILE}={path}: no such file")
            config = path
        try:
            return ClientConfig._of(_with_overrides(config, overrides), zookeeper_required, environ)
        except CommonConfigError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(str(exc)) from None

    @staticmethod
    def _of(config: Config | Mapping[str, Any] | str | Path | None, zookeeper_required: bool,
            environ: Mapping[str, str]) -> ClientConfig:
        keys = _keys()
        if isinstance(config, str | Path):
            config = load(config, keys)
        elif not isinstance(config, Config):
            config = Config(keys, config or {}, "client config")
        config = _merge_environment(config, keys, environ)
        if zookeeper_required and not config["client.servers"]:
            missing = [k for k in ("zookeeper.connectString", "cluster.root") if not config[k]]
            if missing:
                raise ConfigError(
                    f"{config.source}: set client.servers (or {env_name('client.servers')}), or "
                    f"{' and '.join(missing)} to find the cluster in ZooKeeper")
        # the keys' kinds check types and ranges (seconds above 0, counts and the old ms keys at least 1)
        seconds: dict[str, float] = {}
        for old, new in DEPRECATED_MS_KEYS.items():  # a loop, not a comprehension: the warning's stacklevel
            seconds[new] = seconds_or_deprecated_ms(config, new, old, stacklevel=3)  # the caller of of()
        return ClientConfig(
            zookeeper_connect_string=config["zookeeper.connectString"],
            zookeeper_session_timeout_s=seconds_or_deprecated_ms(config, "zookeeper.sessionTimeoutSeconds",
                                                                 "zookeeper.sessionTimeout", stacklevel=3),
            zookeeper_connect_timeout_s=seconds_or_deprecated_ms(config, "zookeeper.connectTimeoutSeconds",
                                                                 "zookeeper.connectTimeout", stacklevel=3),
            cluster_root=config["cluster.root"],
            max_concurrent_transactions=config["client.maxConcurrentTransactions"],
            long_wait_threshold_s=seconds["client.longWaitThresholdSeconds"],
            mount_timeout_s=config["client.mountTimeout"],
            request_timeout_s=config["client.requestTimeout"],
            auto_mount=config["client.autoMount"],
            max_retries=config["client.maxRetries"],
            max_batch_size=config["client.maxBatchSize"],
            keepalive_time_s=seconds["client.keepaliveTimeSeconds"],
            callback_thread=config["client.callbackThread"],
            tls=TlsFiles.from_config(config),
            zookeeper_security=ZkSecurity.from_config(config),
            servers=config["client.servers"],
            discovery_interval_s=seconds["client.discoveryIntervalSeconds"],
            close_timeout_s=config["client.closeTimeout"],
            inline_data_max_bytes=config["client.inlineDataMaxBytes"],
        )

