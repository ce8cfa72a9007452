"""A LocalCluster with mutual TLS on every channel: who is admitted, who is refused, rotation (issue 17)."""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.cli.test_cli_cluster import until
from tests.unit.cli.helpers import Run, waltz
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_cli.errors import CliError
from waltz_cli.storage_session import StorageSession
from waltz_common import devcerts, tls
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.tls import TlsFiles
from waltz_common.types import Record, ReqId, crc32
from waltz_storage.admin_client import StorageAdminClient


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("tls-cluster")
    with LocalCluster(
        workdir,
        storage_nodes=3,
        servers=1,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        cluster_root="/test/tls",
        tls=True,
    ) as running:
        yield running


def _cli(cluster: LocalCluster, capsys, files: TlsFiles | None) -> Callable[..., Run]:
    tls_args = (
        [] if files is None else ["--tls-cert", files.cert_file, "--tls-key", files.key_file, "--tls-ca", files.ca_file]
    )

    def run(*argv: str) -> Run:
        return waltz(
            capsys, "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--timeout", "5", *tls_args, *argv
        )

    return run


def _load_ca(cluster: LocalCluster) -> devcerts.Authority:
    assert cluster.tls_dir is not None
    cert = x509.load_pem_x509_certificate((cluster.tls_dir / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((cluster.tls_dir / "ca-key.pem").read_bytes(), None)
    return devcerts.Authority(cert, key)  # type: ignore[arg-type]


def _files(directory: Path, name: str, cert: bytes, key: bytes, ca: Path) -> TlsFiles:
    (directory / f"{name}.pem").write_bytes(cert)
    (directory / f"{name}-key.pem").write_bytes(key)
    return TlsFiles(str(directory / f"{name}.pem"), str(directory / f"{name}-key.pem"), str(ca))


def test_cli_and_client_work_end_to_end_over_tls(cluster, capsys):
    operator = _cli(cluster, capsys, cluster.tls_files("operator"))
    verified = until(lambda: operator("cluster", "verify"))
    assert verified.code == 0, verified.out + verified.err
    listed = operator("storage", "list", "-s", cluster.storage[0].connect_string, "--json")
    assert listed.code == 0 and listed.json()["partitions"][0]["partition"] == 0, listed.err
    application = _cli(cluster, capsys, cluster.tls_files("application"))
    validated = application("client", "validate", "-n", "20", "--producers", "2", "--consumers", "1", "--json")
    assert validated.code == 0 and validated.json()["passed"], validated.out + validated.err
    assert operator("client", "high-water-mark", "--json").json()["0"] >= 39


def test_plaintext_is_refused(cluster, capsys):
    plain = _cli(cluster, capsys, None)
    run = plain("storage", "list", "-s", cluster.storage[0].connect_string)
    assert run.code == 1 and "over plaintext" in run.err
    with grpc.insecure_channel(cluster.servers[0].address) as channel, pytest.raises(grpc.RpcError) as refused:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_of_another_ca_or_expired_is_refused(cluster, capsys, tmp_path):
    stranger = devcerts.new_authority("another CA")
    (tmp_path / "other-ca.pem").write_bytes(stranger.cert.public_bytes(serialization.Encoding.PEM))
    ours = Path(cluster.tls_files("operator").ca_file)
    foreign = _files(tmp_path, "foreign", *devcerts.issue(stranger, "operator"), ours)
    run = _cli(cluster, capsys, foreign)("storage", "list", "-s", cluster.storage[0].connect_string)
    assert run.code == 1 and "is not reachable" in run.err, run.err
    yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    expired_pem = devcerts.issue(
        _load_ca(cluster), "operator", not_before=yesterday - datetime.timedelta(days=2), not_after=yesterday
    )
    expired = _files(tmp_path, "expired", *expired_pem, ours)
    run = _cli(cluster, capsys, expired)("storage", "list", "-s", cluster.storage[0].connect_string)
    assert run.code == 1 and "is not reachable" in run.err, run.err


def test_an_application_certificate_is_denied_on_the_storage_ports(cluster, capsys):
    application = cluster.tls_files("application")
    run = _cli(cluster, capsys, application)("storage", "list", "-s", cluster.storage[0].connect_string)
    assert run.code == 1 and "PERMISSION_DENIED" in run.err, run.err
    assert "needs a certificate with role operator (spiffe://waltz/role/operator)" in run.err
    assert "has role application" in run.err
    with pytest.raises(CliError) as denied:
        StorageSession(cluster.storage[0].connect_string, cluster.cluster_key, 1, 5, tls_files=application)
    assert "PERMISSION_DENIED" in str(denied.value) and "or server (spiffe://waltz/role/server)" in str(denied.value)


def test_admin_queries_need_the_operator_role_and_bad_bytes_get_a_plain_answer(cluster, capsys):
    """Issue 28: an application certificate may append and read but not ask a server what it owns or which storage
    nodes it reaches; undecodable bytes from an admitted peer get INVALID_ARGUMENT, from a refused one the refusal."""
    server = cluster.servers[0].address
    with tls.channel(server, cluster.tls_files("application")) as channel:
        stub = server_pb2_grpc.WaltzServerStub(channel)
        for call, request in (
            (stub.GetServerPartitions, server_pb2.ServerPartitionsRequest()),
            (stub.CheckStorageConnectivity, server_pb2.StorageConnectivityRequest()),
        ):
            with pytest.raises(grpc.RpcError) as denied:
                call(request, timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "needs a certificate with role operator" in denied.value.details()
        raw = channel.unary_unary(
            "/waltz.v1.WaltzServer/GetHighWaterMark", request_serializer=bytes, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as invalid:
            raw(b"\xff\xff", timeout=5)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid waltz.v1.HighWaterMarkRequest" in invalid.value.details()
    with tls.channel(server, cluster.tls_files("storage")) as channel:  # no client-port role: refused first
        raw = channel.unary_unary(
            "/waltz.v1.WaltzServer/GetHighWaterMark", request_serializer=bytes, response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as denied:
            raw(b"\xff\xff", timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    operator = _cli(cluster, capsys, cluster.tls_files("operator"))
    partitions = until(lambda: operator("server", "partitions", "--json"))
    assert partitions.code == 0, partitions.err


def _presented_serial(port: int, files: TlsFiles) -> int:
    """The serial number of the certificate a port presents to a new connection."""
    context = ssl.create_default_context(cafile=files.ca_file)
    context.load_cert_chain(files.cert_file, files.key_file)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_rotated_files_are_used_by_the_next_connection(cluster, capsys):
    operator = cluster.tls_files("operator")
    node = cluster.storage[2]
    storage = cluster.tls_files("storage")
    before = _presented_serial(node.admin_port, operator)
    assert before == x509.load_pem_x509_certificate(Path(storage.cert_file).read_bytes()).serial_number
    cert, key = devcerts.issue(_load_ca(cluster), "storage")
    Path(storage.key_file).write_bytes(key)
    Path(storage.cert_file).write_bytes(cert)
    after = _presented_serial(node.admin_port, operator)
    assert after == x509.load_pem_x509_certificate(cert).serial_number != before
    run = _cli(cluster, capsys, operator)("storage", "list", "-s", node.connect_string)
    assert run.code == 0, run.err


def test_storage_rules_hold_for_every_certificate(cluster, capsys):
    """Issue 25 under TLS: an operator certificate writes nothing online (no forged record at max+1, no
    Truncate, no SetLowWaterMark), an operator's read with a huge session raises no fence, and even the server
    certificate cannot truncate committed transactions."""
    operator, server = cluster.tls_files("operator"), cluster.tls_files("server")
    node = cluster.storage[0]
    before = until(lambda: _cli(cluster, capsys, operator)("cluster", "verify"))
    assert before.code == 0, before.out
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 1, tls_files=operator) as admin:
        (state,) = admin.list_partitions()
    fence, top = state.fence_session_id, state.max_transaction_id
    forged = Record(top + 1, ReqId(99, 1, 0, 1), 0, b"forged", crc32(b"forged"))
    with StorageSession(node.connect_string, cluster.cluster_key, 1, 5, offline=False, tls_files=operator) as s:
        with pytest.raises(CliError, match="only the server role"):
            s.append(0, fence, [forged])
        with pytest.raises(CliError, match="only the server role"):
            s.truncate(0, fence, max(top - 1, -1))
        with pytest.raises(CliError, match="only the server role"):
            s.set_low_water_mark(0, 10**12, top)
    with StorageSession(node.connect_string, cluster.cluster_key, 1, 5, offline=False, tls_files=operator) as s:
        assert s.max_transaction_id(0, 10**12) == top
    if top >= 1:
        with (
            StorageSession(node.connect_string, cluster.cluster_key, 1, 5, offline=False, tls_files=server) as s,
            pytest.raises(CliError, match="are committed"),
        ):
            s.truncate(0, fence, -1)  # the current session (a newer one from the server role would raise the fence)
    with StorageAdminClient("127.0.0.1", node.admin_port, cluster.cluster_key, 1, tls_files=operator) as admin:
        (after,) = admin.list_partitions()
    assert (after.fence_session_id, after.max_transaction_id) == (fence, top)
    assert _cli(cluster, capsys, operator)("cluster", "verify").code == 0
