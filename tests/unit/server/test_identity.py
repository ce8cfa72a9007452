"""Client identity: the rule that says who may use a client id, and the cache over the bindings (issue 25)."""

from __future__ import annotations

import asyncio

import pytest

from tests.component.server.fakes import MemoryBindings
from waltz.v1 import metadata_pb2
from waltz_common import devcerts
from waltz_server.identity import BindingUnavailable, ClientIdentities, ClientIdentity, Verdict, decide

A = ClientIdentity(("spiffe://waltz/role/application",), "CN=billing,O=example")
B = ClientIdentity(("spiffe://waltz/role/application",), "CN=reports,O=example")
A_AS_OPERATOR = ClientIdentity(("spiffe://waltz/role/operator",), "CN=billing,O=example")


def test_without_an_identity_every_client_id_is_allowed():
    assert decide(7, None, A, 10).verdict is Verdict.ALLOW
    assert decide(7, None, None, None).verdict is Verdict.ALLOW


def test_the_bound_identity_is_allowed_and_any_other_denied():
    assert decide(7, A, A, None).verdict is Verdict.ALLOW
    for other in (B, A_AS_OPERATOR):  # the role counts as much as the subject
        denied = decide(7, other, A, None)
        assert denied.verdict is Verdict.DENY
        assert "client id 7 belongs to another identity" in denied.message
        assert other.describe() in denied.message
    assert A.subject not in decide(7, B, A, None).message  # the owner is not named to a stranger


def test_an_unbound_id_is_bound_only_if_it_was_handed_out():
    assert decide(7, A, None, 7).verdict is Verdict.BIND
    assert decide(7, A, None, None).verdict is Verdict.BIND
    for never in (8, 0, -3):
        denied = decide(never, A, None, 7)
        assert denied.verdict is Verdict.DENY and f"client id {never} was never handed out" in denied.message


def test_an_identity_is_the_certificates_roles_and_subject(tmp_path):
    files = devcerts.write(tmp_path)
    identity = ClientIdentity.of_certificate(files["application"].read_bytes())
    assert identity == ClientIdentity(("spiffe://waltz/role/application",), "CN=waltz application,O=waltz")
    ca = devcerts.new_authority()
    other, _ = devcerts.issue(ca, "application", common_name="reports")
    assert ClientIdentity.of_certificate(other).subject == "CN=reports,O=waltz"
    message = identity.to_proto()
    assert ClientIdentity.from_proto(metadata_pb2.ClientIdentity.FromString(message.SerializeToString())) == identity
    assert identity.describe() == "role application, subject CN=waltz application,O=waltz"


def test_the_first_identity_binds_a_handed_out_id_and_others_are_denied_from_the_cache():
    async def scenario():
        store = MemoryBindings()
        identities = ClientIdentities(store)
        assert await identities.check(5, A) is None
        assert store.bindings == {5: A}
        calls = store.calls
        assert await identities.check(5, A) is None
        denied = await identities.check(5, B)
        assert denied is not None and "belongs to another identity" in denied
        assert store.calls == calls  # bindings never change: the cache answers
        assert await identities.check(5, None) is None

    asyncio.run(scenario())


def test_a_binding_made_by_another_server_is_respected():
    async def scenario():
        store = MemoryBindings()
        store.bindings[5] = A  # bound by another server (or before a restart)
        fresh = ClientIdentities(store)
        assert await fresh.check(5, B) is not None
        assert await fresh.check(5, A) is None
        assert store.bindings == {5: A}

    asyncio.run(scenario())


def test_claim_binds_a_new_id_unless_another_identity_holds_it():
    async def scenario():
        store = MemoryBindings()
        identities = ClientIdentities(store)
        assert await identities.claim(1, A)
        store.bindings[2] = B  # mounted before it was handed out
        assert not await identities.claim(2, A)
        assert await identities.check(1, B) is not None

    asyncio.run(scenario())


def test_ids_never_handed_out_are_not_bound():
    async def scenario():
        store = MemoryBindings(issued=3)
        identities = ClientIdentities(store)
        denied = await identities.check(4, A)
        assert denied is not None and "never handed out" in denied
        assert store.bindings == {}

    asyncio.run(scenario())


def test_an_unreachable_store_is_unavailable_not_a_denial_and_the_cache_is_bounded():
    async def scenario():
        store = MemoryBindings()
        identities = ClientIdentities(store, cache_size=2)
        for cid in (1, 2, 3):
            assert await identities.check(cid, A) is None
        store.fail = True
        assert await identities.check(3, A) is None  # cached
        with pytest.raises(BindingUnavailable, match="ZooKeeper is gone"):
            await identities.check(1, A)  # forgotten: the oldest went first

        class Slow(MemoryBindings):
            async def bound(self, client_id: int) -> ClientIdentity | None:
                await asyncio.sleep(10)
                return None

        with pytest.raises(BindingUnavailable, match=r"did not answer within 0\.05 s"):
            await ClientIdentities(Slow(), timeout_s=0.05).check(1, A)

    asyncio.run(scenario())
