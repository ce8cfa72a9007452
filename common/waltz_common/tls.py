"""TLS and mutual TLS on every Waltz channel: PEM files named in configuration, credentials that pick up
rotated files on the next connection, and the role a certificate carries (docs/security.md).

A certificate's role is a URI subject alternative name ``spiffe://waltz/role/<role>`` with role one of
server, storage, operator, application. Each side checks the other's certificate against the cluster's CA
(``tls.caFile``); a gRPC port then admits only the roles it serves (port_guard.PortGuard).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import grpc

from waltz_common.config import Config, ConfigError, Key, text

ROLE_URI_PREFIX = "spiffe://waltz/role/"
ROLES = ("server", "storage", "operator", "application")

TLS_KEYS: tuple[Key, ...] = (
    Key("tls.certFile", text, None, "PEM certificate (chain) of this component; with keyFile and caFile turns TLS on"),
    Key("tls.keyFile", text, None, "PEM private key of tls.certFile"),
    Key("tls.caFile", text, None, "PEM CA certificate(s) every peer's certificate must chain to (mutual TLS)"),
)


@dataclass(frozen=True)
class TlsFiles:
    """The three PEM files of one component; read again whenever they change on disk."""

    cert_file: str
    key_file: str
    ca_file: str

    @classmethod
    def from_config(cls, config: Config) -> TlsFiles | None:
        """None when no tls.* key is set; a ConfigError when only some are, or a file cannot be read."""
        return cls.of(config["tls.certFile"], config["tls.keyFile"], config["tls.caFile"], config.source)

    @classmethod
    def of(cls, cert: str | None, key: str | None, ca: str | None, source: str = "TLS options") -> TlsFiles | None:
        given = {"tls.certFile": cert, "tls.keyFile": key, "tls.caFile": ca}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise ConfigError(f"{source}: TLS needs all of tls.certFile, tls.keyFile, tls.caFile; missing {missing}")
        for name, value in given.items():
            if not os.access(str(value), os.R_OK):
                raise ConfigError(f"{source}: {name}: cannot read {value}")
        return cls(str(cert), str(key), str(ca))

    def as_config(self) -> dict[str, str]:
        """The tls.* configuration keys naming these files."""
        return {"tls.certFile": self.cert_file, "tls.keyFile": self.key_file, "tls.caFile": self.ca_file}

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA) as bytes."""
        with open(self.cert_file, "rb") as c, open(self.key_file, "rb") as k, open(self.ca_file, "rb") as a:
            return c.read(), k.read(), a.read()

    def stamp(self) -> tuple[tuple[int, int], ...]:
        """What changes when any file is replaced or rewritten."""
        stats = [os.stat(p) for p in (self.cert_file, self.key_file, self.ca_file)]
        return tuple((s.st_mtime_ns, s.st_size) for s in stats)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Mutual TLS server credentials; each new connection's handshake uses the files as they are then."""
    lock = threading.Lock()
    seen = [files.stamp()]

    def configuration() -> grpc.ServerCertificateConfiguration:
        cert, key, ca = files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            with lock:
                stamp = files.stamp()
                if stamp == seen[0]:
                    return None
                fresh = configuration()
                seen[0] = stamp
                return fresh
        except OSError:  # half-written or missing during a rotation: keep the current one, retry next time
            return None

    return grpc.dynamic_ssl_server_credentials(configuration(), fetch, require_client_authentication=True)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials from the files as they are now (a channel made later reads them again)."""
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def channel(target: str, files: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel: TLS when files are given, plaintext otherwise."""
    if files is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, channel_credentials(files), options=list(options))


def aio_channel(target: str, files: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel: TLS when files are given, plaintext otherwise."""
    if files is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, channel_credentials(files), options=list(options))


_process_files: list[TlsFiles | None] = [None]


def use_for_process(files: TlsFiles | None) -> None:
    """The identity a service presents on the channels it opens itself (a server to its storage nodes)."""
    _process_files[0] = files


def process_files() -> TlsFiles | None:
    return _process_files[0]


def add_port(server: grpc.aio.Server, address: str, files: TlsFiles | None) -> int:
    """Bind address with mutual TLS when files are given, plaintext otherwise; the bound port (0: failed)."""
    if files is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(files))


@lru_cache(maxsize=256)
def roles_of(pem: bytes) -> frozenset[str]:
    """The Waltz roles a PEM certificate carries in its URI subject alternative names."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    return frozenset(u[len(ROLE_URI_PREFIX) :] for u in uris if u.startswith(ROLE_URI_PREFIX))


@lru_cache(maxsize=256)
def subject_of(pem: bytes) -> str:
    """The subject distinguished name of a PEM certificate (RFC 4514), e.g. 'CN=billing,O=example'."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem).subject.rfc4514_string()


def peer_pem(context: grpc.aio.ServicerContext) -> bytes | None:
    """The certificate the peer of a call presented (mutual TLS); None on a plaintext port."""
    pems = context.auth_context().get("x509_pem_cert") or []
    return pems[0] if pems else None


def role_uri(role: str) -> str:
    return f"{ROLE_URI_PREFIX}{role}"


def refusal(port: str, allowed: Iterable[str], held: Iterable[str]) -> str | None:
    """None when a peer holding roles held may use the port; else the PERMISSION_DENIED message."""
    allowed, held = sorted(allowed), sorted(held)
    if set(allowed) & set(held):
        return None
    needed = " or ".join(f"{r} ({role_uri(r)})" for r in allowed)
    has = ", ".join(held) if held else "none"
    return f"the {port} needs a certificate with role {needed}; the peer's certificate has role {has}"
