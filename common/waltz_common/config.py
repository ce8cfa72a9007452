"""YAML configuration files: typed keys with documented defaults, dotted or nested names."""

from __future__ import annotations

import difflib
import logging
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_REQUIRED = object()
log = logging.getLogger(__name__)

EXIT_CONFIG = 2
"""The exit status of every Waltz process (waltz-server, waltz-storage, the waltz CLI, waltz dev) whose
configuration is wrong: a missing or unreadable file, an unknown key, a value of the wrong type or out of
range. 2 is also what argparse exits with for a bad command line: both say "fix what you gave me"."""

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})
"""Listen addresses meaning "every interface": fine to bind, useless to tell a client to connect to."""


class ConfigError(ValueError):
    """A configuration file is missing, malformed, or has a bad or missing value."""


class Integer:
    """Key kind: a whole number within [low, high] (None: unbounded). A float (even 5.0), a boolean (YAML's
    true is Python's 1) or a string that is not all digits is refused, not truncated or coerced; a string of
    digits is accepted, since overrides given on a command line are strings."""

    def __init__(self, low: int | None = None, high: int | None = None, label: str = "int") -> None:
        self.low = low
        self.high = high
        self.__name__ = f"{label}, {self.range_text()}" if low is not None or high is not None else label

    def range_text(self) -> str:
        if self.high is None:
            return f"at least {self.low}"
        if self.low is None:
            return f"at most {self.high}"
        return f"{self.low}..{self.high}"

    def __call__(self, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is a boolean, not an integer ({self.range_text()})")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            number = int(value.strip())
        else:
            raise ValueError(f"{value!r} is not an integer ({self.range_text()})")
        if (self.low is not None and number < self.low) or (self.high is not None and number > self.high):
            raise ValueError(f"{number} is out of range ({self.range_text()})")
        return number

    def __repr__(self) -> str:
        return f"Integer({self.low}, {self.high})"


class Number:
    """Key kind: a number (int or float) of at least low, or above it when exclusive; booleans refused."""

    def __init__(self, low: float = 0.0, exclusive: bool = False) -> None:
        self.low = low
        self.exclusive = exclusive
        self.__name__ = f"float, {self.range_text()}"

    def range_text(self) -> str:
        return f"{'above' if self.exclusive else 'at least'} {self.low:g}"

    def __call__(self, value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is a boolean, not a number")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a finite number")
        if number < self.low or (self.exclusive and number == self.low):
            raise ValueError(f"{value!r} is out of range ({self.range_text()})")
        return number

    def __repr__(self) -> str:
        return f"Number({self.low}, exclusive={self.exclusive})"


PORT = Integer(1, 65535, "port")
"""A TCP port a process listens on or connects to."""
PORT_OR_ZERO = Integer(0, 65535, "port")
"""A TCP port where 0 has a documented meaning (off, or: pick a free one)."""
COUNT = Integer(1)
"""A size, count or interval that must be at least 1."""
SECONDS = Number(0.0)
"""A duration in seconds, 0 or more."""
POSITIVE_SECONDS = Number(0.0, exclusive=True)
"""A duration in seconds above 0."""


def text(value: Any) -> str:
    """Key kind for strings: YAML scalars that are not strings (a number, a boolean) are refused rather than
    turned into "True" or "1.0"; a mapping or list is refused too."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


text.__name__ = "str"


@dataclass(frozen=True)
class Key:
    """One configuration key: its dotted name, type, default and what it means."""

    name: str
    kind: Callable[[Any], Any]
    default: Any = _REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise ValueError(f"not a boolean: {value!r}")


def boolean(value: Any) -> bool:
    """Key kind for booleans (true/false, yes/no, on/off, 1/0)."""
    return _to_bool(value)


class Config:
    """Validated configuration values, looked up by dotted key name."""

    def __init__(self, keys: Iterable[Key], values: Mapping[str, Any], source: str = "<dict>") -> None:
        self._keys = {k.name: k for k in keys}
        self.source = source
        flat = _flatten(values)
        unknown = sorted(set(flat) - set(self._keys))
        if unknown:
            named = ", ".join(f"{name}{did_you_mean(name, self._keys)}" for name in unknown)
            raise ConfigError(f"{source}: unknown configuration key(s): {named}")
        self.given = frozenset(name for name, value in flat.items() if value is not None)
        """The keys the values set (not None), as opposed to those left at their defaults."""
        self._values: dict[str, Any] = {}
        for name, key in self._keys.items():
            if name in flat and flat[name] is not None:
                try:
                    self._values[name] = key.kind(flat[name])
                except (TypeError, ValueError) as exc:
                    raise ConfigError(f"{source}: {name}: {exc}") from None
            elif key.required:
                raise ConfigError(f"{source}: required key {name} is missing ({key.doc})")
            else:
                self._values[name] = key.default

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean client.mountTimeout?)' for a misspelled key (case or a few letters off), else ''."""
    known = list(known)
    by_case = {k.lower(): k for k in known}
    close = [by_case[name.lower()]] if name.lower() in by_case else difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def load(path: str | Path, keys: Iterable[Key], overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a YAML file and validate it against keys; overrides (dotted names) win."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    flat = _flatten(data)
    flat.update(overrides or {})
    return Config(keys, flat, str(path))


def seconds_or_deprecated_ms(config: Config, new: str, old: str, stacklevel: int = 2) -> float:
    """The value of a seconds key, or of its deprecated milliseconds key when only that is set (with a
    DeprecationWarning, stacklevel as warnings.warn's counted from the caller, and a log warning); both set is a
    ConfigError."""
    if old not in config.given:
        return float(config[new])
    if new in config.given:
        raise ConfigError(f"{config.source}: set {new} (seconds) only, not also {old} (deprecated, milliseconds)")
    message = f"{config.source}: {old} (milliseconds) is deprecated: use {new} (seconds)"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)
    log.warning("%s", message)
    return float(config[old]) / 1000


def zookeeper_session_timeout_s(config: Config) -> float:
    """zookeeper.sessionTimeoutSeconds, or the deprecated zookeeper.sessionTimeout (milliseconds, warned about)."""
    return seconds_or_deprecated_ms(config, "zookeeper.sessionTimeoutSeconds", "zookeeper.sessionTimeout", 2)


def zookeeper_connect_timeout_s(config: Config) -> float:
    """zookeeper.connectTimeoutSeconds, or the deprecated zookeeper.connectTimeout (milliseconds, warned about)."""
    return seconds_or_deprecated_ms(config, "zookeeper.connectTimeoutSeconds", "zookeeper.connectTimeout", 2)


def describe(keys: Iterable[Key]) -> str:
    """A table of keys, defaults and meanings, for --help and the README."""
    lines = []
    for key in keys:
        default = "(required)" if key.required else repr(key.default)
        lines.append(f"  {key.name:<40} {default:<14} {key.doc}")
    return "\n".join(lines)


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" ("[::1]:80" too); ValueError naming the address when it is not one."""
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    try:
        return host, PORT(port)
    except ValueError as exc:
        raise ValueError(f"{address!r}: port {exc}") from None


def optional_address(value: Any) -> str:
    """Key kind: "host:port" with a port of 1..65535, or empty."""
    address = text(value).strip()
    if address:
        split_address(address)
    return address


optional_address.__name__ = "host:port"


def address_list(value: Any) -> tuple[str, ...]:
    """A list of servers: "host:port,host:port" or a YAML list of host:port."""
    items = value.split(",") if isinstance(value, str) else list(value)
    servers = tuple(str(item).strip() for item in items if str(item).strip())
    for server in servers:
        split_address(server)
    return servers


ZOOKEEPER_KEYS = (
    Key("zookeeper.connectString", text, doc="ZooKeeper connect string, host:port[,host:port...]"),
    Key("zookeeper.sessionTimeoutSeconds", POSITIVE_SECONDS, 30.0,
        "ZooKeeper session timeout, seconds: a server's partitions move this long after it dies (unless its peers "
        "detect it sooner)"),
    Key("zookeeper.sessionTimeout", COUNT, None, "deprecated: milliseconds; use zookeeper.sessionTimeoutSeconds"),
    Key("zookeeper.connectTimeoutSeconds", POSITIVE_SECONDS, 10.0, "how long to wait for ZooKeeper at start, seconds"),
    Key("zookeeper.connectTimeout", COUNT, None, "deprecated: milliseconds; use zookeeper.connectTimeoutSeconds"),
    Key("cluster.root", text, doc="the cluster's root znode, e.g. /waltz/my_cluster"),
    Key(
        "zookeeper.tls.certFile",
        text,
        None,
        "PEM client certificate for ZooKeeper's secure client port; with keyFile and caFile turns TLS to ZooKeeper on",
    ),
    Key("zookeeper.tls.keyFile", text, None, "PEM private key of zookeeper.tls.certFile"),
    Key("zookeeper.tls.caFile", text, None, "PEM CA that ZooKeeper's server certificate must chain to"),
    Key("zookeeper.auth", text, None, "scheme:credential added to the ZooKeeper session, e.g. digest:server:secret"),
    Key(
        "zookeeper.acl",
        text,
        None,
        "semicolon-separated scheme:id (e.g. digest:operator:<base64 SHA-1>; x509:CN=...) given every "
        "permission on the znodes this process creates; anyone else may only read them (docs/security.md)",
    ),
)
