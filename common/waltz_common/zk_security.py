"""ZooKeeper's own TLS, authentication and ACLs for Waltz's kazoo clients (the zookeeper.tls.*, zookeeper.auth
and zookeeper.acl keys; docs/security.md).

kazoo is imported only when an ACL is built: a client that finds the cluster through client.servers reads these
keys (all unset) without kazoo installed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from waltz_common.config import Config, ConfigError
from waltz_common.tls import TlsFiles

if TYPE_CHECKING:
    from kazoo.security import ACL

WORLD = ("world", "anyone")
"""The (scheme, id) of everyone (kazoo's Id is a namedtuple of the two, so it compares equal)."""
KEY_NAMES = (
    "zookeeper.tls.certFile",
    "zookeeper.tls.keyFile",
    "zookeeper.tls.caFile",
    "zookeeper.auth",
    "zookeeper.acl",
)


@dataclass(frozen=True)
class ZkSecurity:
    """How to reach ZooKeeper: TLS files, an auth (scheme, credential), and the ACL of the znodes created."""

    tls: TlsFiles | None = None
    auth: tuple[str, str] | None = None
    acl: tuple[ACL, ...] = ()

    @classmethod
    def from_config(cls, config: Config) -> ZkSecurity:
        return cls.of(
            config["zookeeper.tls.certFile"],
            config["zookeeper.tls.keyFile"],
            config["zookeeper.tls.caFile"],
            config["zookeeper.auth"],
            config["zookeeper.acl"],
            config.source,
        )

    @classmethod
    def of(
        cls,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        auth: str | None = None,
        acl: str | None = None,
        source: str = "ZooKeeper options",
    ) -> ZkSecurity:
        files = TlsFiles.of(cert, key, ca, f"{source} (zookeeper.tls.*)")
        return cls(files, _auth(auth, source) if auth else None, parse_acl(acl, source) if acl else ())

    def kazoo_args(self) -> dict[str, Any]:
        """Keyword arguments of KazooClient."""
        args: dict[str, Any] = {}
        if self.tls is not None:
            args.update(
                use_ssl=True,
                verify_certs=True,
                certfile=self.tls.cert_file,
                keyfile=self.tls.key_file,
                ca=self.tls.ca_file,
            )
        if self.auth is not None:
            args["auth_data"] = [self.auth]
        if self.acl:
            args["default_acl"] = list(self.acl)
        return args


def _auth(text: str, source: str) -> tuple[str, str]:
    scheme, sep, credential = text.partition(":")
    if not sep or not scheme or not credential:
        raise ConfigError(f"{source}: zookeeper.auth must look like scheme:credential, e.g. digest:server:secret")
    return scheme, credential


def parse_acl(text: str, source: str = "zookeeper.acl") -> tuple[ACL, ...]:
    """'digest:operator:HASH; x509:CN=waltz server,O=waltz' -> every permission for each, READ for anyone else.
    Entries are separated by semicolons (x509 ids hold commas)."""
    from kazoo.security import ACL, Id, Permissions

    entries: list[ACL] = []
    for item in (part.strip() for part in text.split(";") if part.strip()):
        scheme, sep, ident = item.partition(":")
        if not sep or not scheme or not ident:
            raise ConfigError(f"{source}: zookeeper.acl entry {item!r} is not scheme:id (e.g. digest:server:HASH)")
        entries.append(ACL(Permissions.ALL, Id(scheme, ident)))
    if not any(e.id == WORLD for e in entries):
        entries.append(ACL(Permissions.READ, _world()))
    return tuple(entries)


def _world() -> Any:
    from kazoo.security import Id

    return Id(*WORLD)
