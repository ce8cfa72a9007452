"""YAML configuration files: typed keys with documented defaults, dotted or nested names."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_REQUIRED = object()


class ConfigError(ValueError):
    """A configuration file is missing, malformed, or has a bad or missing value."""


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


def describe(keys: Iterable[Key]) -> str:
    """A table of keys, defaults and meanings, for --help and the README."""
    lines = []
    for key in keys:
        default = "(required)" if key.required else repr(key.default)
        lines.append(f"  {key.name:<40} {default:<14} {key.doc}")
    return "\n".join(lines)


def address_list(value: Any) -> tuple[str, ...]:
    """A list of servers: "host:port,host:port" or a YAML list of host:port."""
    items = value.split(",") if isinstance(value, str) else list(value)
    servers = tuple(str(item).strip() for item in items if str(item).strip())
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{server!r} is not host:port")
    return servers


ZOOKEEPER_KEYS = (
    Key("zookeeper.connectString", str, doc="ZooKeeper connect string, host:port[,host:port...]"),
    Key("zookeeper.sessionTimeout", int, 30000, "ZooKeeper session timeout in milliseconds"),
    Key("zookeeper.connectTimeout", int, 10000, "how long to wait for ZooKeeper at start, milliseconds"),
    Key("cluster.root", str, doc="the cluster's root znode, e.g. /waltz/my_cluster"),
    Key(
        "zookeeper.tls.certFile",
        str,
        None,
        "PEM client certificate for ZooKeeper's secure client port; with keyFile and caFile turns TLS to ZooKeeper on",
    ),
    Key("zookeeper.tls.keyFile", str, None, "PEM private key of zookeeper.tls.certFile"),
    Key("zookeeper.tls.caFile", str, None, "PEM CA that ZooKeeper's server certificate must chain to"),
    Key("zookeeper.auth", str, None, "scheme:credential added to the ZooKeeper session, e.g. digest:server:secret"),
    Key(
        "zookeeper.acl",
        str,
        None,
        "semicolon-separated scheme:id (e.g. digest:operator:<base64 SHA-1>; x509:CN=...) given every "
        "permission on the znodes this process creates; anyone else may only read them (docs/security.md)",
    ),
)
