"""Client identity over a mutual TLS Stream: a client id is used only by the certificate that took it (issue 25).

The finding: with TLS, client B (another application certificate) mounted with A's client id (A was told
SUPERSEDED), committed under A's next ReqId (A's real append was then answered ALREADY_COMMITTED) and could push
A's sequence number 2^31-1 ahead. Now B's Mount and Append are refused PERMISSION_DENIED and A is undisturbed.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from waltz.v1 import server_pb2
from waltz_common import devcerts
from waltz_common.tls import TlsFiles
from waltz_common.types import INT32_MAX
from waltz_server.identity import ClientIdentities, ClientIdentity

from .fakes import MemoryBindings
from .grpc_harness import served
from .harness import run
from .helpers import append, mount, req

Reason = server_pb2.AppendRejected.Reason
State = server_pb2.MountResponse


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, TlsFiles]:
    """A CA, the server's certificate and two applications' (A and B: same role, different subjects)."""
    directory = tmp_path_factory.mktemp("identity-certs")
    ca = devcerts.new_authority()
    (directory / "ca.pem").write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    files = {}
    for name, role, common_name in (
        ("server", "server", None),
        ("a", "application", "waltz application A"),
        ("b", "application", "waltz application B"),
    ):
        cert, key = devcerts.issue(ca, role, common_name=common_name)
        (directory / f"{name}.pem").write_bytes(cert)
        (directory / f"{name}-key.pem").write_bytes(key)
        files[name] = TlsFiles(
            str(directory / f"{name}.pem"), str(directory / f"{name}-key.pem"), str(directory / "ca.pem")
        )
    return files


def identity(files: TlsFiles) -> ClientIdentity:
    return ClientIdentity.of_certificate(Path(files.cert_file).read_bytes())


def test_another_certificate_cannot_mount_or_append_under_a_client_id(certs):
    async def scenario():
        bindings = MemoryBindings(issued=10)
        async with served(owned=(0,), tls_files=certs["server"], identities=ClientIdentities(bindings)) as s:
            a = s.open_stream(s.stub_as(certs["a"]))
            await a.send(mount=mount(client_id=1, seq=1, partition_id=0))
            await a.receive_until(lambda h: h.of("mount"))
            assert a.of("mount")[0].state == State.READY
            assert bindings.bindings == {1: identity(certs["a"])}  # the first mount bound the handed-out id
            await a.send(appends=server_pb2.AppendBatch(requests=[append(client_id=1, seq=2)]))
            await a.receive_until(lambda h: len(h.fed()) == 1)

            b = s.open_stream(s.stub_as(certs["b"]))
            # a newer network client than A's (net_seq 2): before, A was told SUPERSEDED
            await b.send(mount=mount(client_id=1, seq=1, partition_id=0, net_seq=2))
            await b.receive_until(lambda h: h.of("mount"))
            denied = b.of("mount")[0]
            assert denied.state == State.PERMISSION_DENIED and not denied.partition_ready
            assert "client id 1 belongs to another identity" in denied.message
            assert "subject CN=waltz application B,O=waltz" in denied.message
            forged = [append(client_id=1, seq=3, data=b"forged"), append(client_id=1, seq=INT32_MAX, data=b"ahead")]
            await b.send(appends=server_pb2.AppendBatch(requests=forged))
            await b.receive_until(lambda h: len(h.of("append_rejected")) == 2)
            assert {(r.req_id.seq_num, r.reason) for r in b.of("append_rejected")} == {
                (3, Reason.PERMISSION_DENIED),
                (INT32_MAX, Reason.PERMISSION_DENIED),
            }
            assert all("belongs to another identity" in r.message for r in b.of("append_rejected"))

            # A is undisturbed: no SUPERSEDED, its next ReqIds commit as its own data
            mine = [append(client_id=1, seq=3), append(client_id=1, seq=4)]
            await a.send(appends=server_pb2.AppendBatch(requests=mine))
            await a.send(flush=server_pb2.FlushRequest(req_id=req(client_id=1, seq=4)))
            await a.receive_until(lambda h: len(h.fed()) == 3 and h.of("flush"))
            assert a.fed() == [(0, 2), (1, 3), (2, 4)]
            assert a.of("append_rejected") == [] and len(a.of("mount")) == 1
            assert [r.data for r in s.stores[0].records] == [b"x", b"x", b"x"]

            # B's stream goes on under a client id of its own
            await b.send(mount=mount(client_id=2, seq=1, partition_id=0))
            await b.receive_until(lambda h: len(h.of("mount")) == 2)
            assert b.of("mount")[1].state == State.READY
            await b.send(appends=server_pb2.AppendBatch(requests=[append(client_id=2, seq=2, data=b"mine")]))
            await b.receive_until(lambda h: (3, 2) in h.fed())
            assert bindings.bindings == {1: identity(certs["a"]), 2: identity(certs["b"])}
            await a.call.done_writing()
            await b.call.done_writing()

    run(scenario)


def test_unbound_ids_never_handed_out_and_an_unreachable_store(certs):
    async def scenario():
        bindings = MemoryBindings(issued=3)
        async with served(owned=(0,), tls_files=certs["server"], identities=ClientIdentities(bindings)) as s:
            b = s.open_stream(s.stub_as(certs["b"]))
            await b.send(mount=mount(client_id=4, seq=1, partition_id=0))  # the next id anyone will be handed
            await b.receive_until(lambda h: h.of("mount"))
            assert b.of("mount")[0].state == State.PERMISSION_DENIED
            assert "client id 4 was never handed out" in b.of("mount")[0].message
            bindings.fail = True
            await b.send(mount=mount(client_id=3, seq=2, partition_id=0))
            await b.receive_until(lambda h: len(h.of("mount")) == 2)
            retry = b.of("mount")[1]
            assert retry.state == State.NOT_READY and "cannot check which identity client id 3" in retry.message
            bindings.fail = False
            await b.send(mount=mount(client_id=3, seq=3, partition_id=0))
            await b.receive_until(lambda h: len(h.of("mount")) == 3)
            assert b.of("mount")[2].state == State.READY
            assert bindings.bindings == {3: identity(certs["b"])}
            await b.call.done_writing()

    run(scenario)


class _View:
    """GetClientId's source of ids: the counter, in memory."""

    def __init__(self) -> None:
        self.next = 0

    async def take_client_id(self) -> int:
        self.next += 1
        return self.next


def test_get_client_id_binds_the_id_to_the_caller_and_skips_ids_bound_already(certs):
    async def scenario():
        bindings = MemoryBindings()
        bindings.bindings[1] = identity(certs["b"])  # B mounted id 1 before it was handed out
        async with served(owned=(0,), tls_files=certs["server"], identities=ClientIdentities(bindings)) as s:
            assert s.service is not None
            s.service.serve_discovery(_View())  # type: ignore[arg-type]
            taken = await s.stub_as(certs["a"]).GetClientId(server_pb2.ClientIdRequest(), timeout=10)
            assert taken.client_id == 2 and bindings.bindings[2] == identity(certs["a"])
            b = s.open_stream(s.stub_as(certs["b"]))
            await b.send(mount=mount(client_id=2, seq=1, partition_id=0))
            await b.receive_until(lambda h: h.of("mount"))
            assert b.of("mount")[0].state == State.PERMISSION_DENIED
            await b.call.done_writing()

    run(scenario)


def test_without_tls_there_is_no_identity_and_any_client_may_use_any_client_id():
    # the trust model of a plaintext cluster (docs/security.md): nothing tells clients apart
    async def scenario():
        bindings = MemoryBindings()
        async with served(owned=(0,), identities=ClientIdentities(bindings)) as s:
            a, b = s.open_stream(), s.open_stream()
            await a.send(mount=mount(client_id=1, seq=1, partition_id=0))
            await a.receive_until(lambda h: h.of("mount"))
            await b.send(mount=mount(client_id=1, seq=2, partition_id=0, net_seq=2))
            await b.receive_until(lambda h: h.of("mount"))
            assert b.of("mount")[0].state == State.READY
            await a.receive_until(lambda h: len(h.of("mount")) == 2)
            assert a.of("mount")[1].state == State.SUPERSEDED
            assert bindings.calls == 0
            for stream in (a, b):
                await stream.call.done_writing()

    run(scenario)


def test_the_plaintext_and_role_checks_still_come_first(certs):
    async def scenario():
        async with served(owned=(0,), tls_files=certs["server"], identities=ClientIdentities(MemoryBindings())) as s:
            with pytest.raises(grpc.aio.AioRpcError) as refused:  # the server's certificate has no client role
                await s.stub.GetClientId(server_pb2.ClientIdRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED

    run(scenario)
