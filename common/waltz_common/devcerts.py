"""`waltz-dev-certs DIR`: a development CA and one certificate per role (server, storage, operator,
application), PEM files for the tls.* keys. Not for production: the CA key lies next to the certificates."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from waltz_common import build_info
from waltz_common.tls import ROLES, role_uri

DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Authority:
    """A CA's certificate and key, able to issue role certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "waltz"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_authority(name: str = "waltz development CA", days: int = 3650) -> Authority:
    """A self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def issue(
    ca: Authority,
    role: str,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    *,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    common_name: str | None = None,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) carrying role as a spiffe://waltz/role/<role> URI and hosts as DNS/IP names;
    valid as a TLS server and client certificate. Its subject is CN=<common_name> (default 'waltz <role>'),
    O=waltz: two applications with different names are different client identities."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(role))]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name or f"waltz {role}"))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def write(directory: str | Path, hosts: tuple[str, ...] = DEFAULT_HOSTS) -> dict[str, Path]:
    """Write ca.pem, ca-key.pem and <role>.pem, <role>-key.pem for every role; returns the paths by name."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca = new_authority()
    files = {"ca": out / "ca.pem", "ca-key": out / "ca-key.pem"}
    files["ca"].write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    _write_private(files["ca-key"], _pem_key(ca.key))
    for role in ROLES:
        cert, key = issue(ca, role, hosts)
        files[role], files[f"{role}-key"] = out / f"{role}.pem", out / f"{role}-key.pem"
        files[role].write_bytes(cert)
        _write_private(files[f"{role}-key"], key)
    return files


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="waltz-dev-certs", description=__doc__)
    build_info.add_version_option(parser)
    parser.add_argument("directory", help="where to write the PEM files (created if missing)")
    parser.add_argument(
        "--host",
        action="append",
        dest="hosts",
        metavar="NAME",
        help=f"a DNS name or IP of the services (repeatable; default {', '.join(DEFAULT_HOSTS)})",
    )
    args = parser.parse_args(argv)
    files = write(args.directory, tuple(args.hosts or DEFAULT_HOSTS))
    for name, path in files.items():
        print(f"{name:<16} {path}")
    print("set tls.caFile to ca.pem, and tls.certFile/tls.keyFile to <role>.pem/<role>-key.pem of each component")
    return 0


if __name__ == "__main__":
    sys.exit(main())
