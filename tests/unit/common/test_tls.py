"""Certificate roles, the role refusal message, TLS configuration checks and the development certificates."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from waltz_common import devcerts, tls
from waltz_common.config import Config, ConfigError


def test_dev_certificates_carry_their_role_and_hosts(tmp_path):
    files = devcerts.write(tmp_path, ("db.internal", "10.0.0.7"))
    for role in tls.ROLES:
        pem = files[role].read_bytes()
        assert tls.roles_of(pem) == {role}
        names = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
        assert "db.internal" in names.value.get_values_for_type(x509.DNSName)
        assert (files[f"{role}-key"].stat().st_mode & 0o777) == 0o600
    with pytest.raises(ValueError, match="unknown role 'admin'"):
        devcerts.issue(devcerts.new_authority(), "admin")


def test_a_certificate_without_a_role_has_none():
    ca = devcerts.new_authority()
    assert tls.roles_of(ca.cert.public_bytes(serialization.Encoding.PEM)) == frozenset()


def test_refusal_names_the_missing_role():
    assert tls.refusal("admin port", ["operator"], {"operator"}) is None
    assert tls.refusal("storage port", ["server", "operator"], {"server"}) is None
    message = tls.refusal("admin port", ["operator"], {"application"})
    assert message == (
        "the admin port needs a certificate with role operator (spiffe://waltz/role/operator); "
        "the peer's certificate has role application"
    )
    assert "has role none" in (tls.refusal("admin port", ["operator"], set()) or "")


def test_tls_configuration_is_all_or_nothing(tmp_path):
    assert tls.TlsFiles.from_config(Config(tls.TLS_KEYS, {})) is None
    with pytest.raises(ConfigError, match=r"missing \['tls.keyFile', 'tls.caFile'\]"):
        tls.TlsFiles.from_config(Config(tls.TLS_KEYS, {"tls.certFile": "a.pem"}, "x.yaml"))
    files = devcerts.write(tmp_path)
    given = {"tls.certFile": str(files["server"]), "tls.keyFile": str(files["server-key"]), "tls.caFile": "nope.pem"}
    with pytest.raises(ConfigError, match=r"tls\.caFile: cannot read nope\.pem"):
        tls.TlsFiles.from_config(Config(tls.TLS_KEYS, given))
    given["tls.caFile"] = str(files["ca"])
    loaded = tls.TlsFiles.from_config(Config(tls.TLS_KEYS, given))
    assert loaded is not None and loaded.as_config() == given
    before = loaded.stamp()
    files["server"].write_bytes(files["server"].read_bytes() + b"\n")
    assert loaded.stamp() != before
