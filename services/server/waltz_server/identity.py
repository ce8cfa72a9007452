"""Client identity: under mutual TLS a client id belongs to the identity that took it (docs/security.md).

An identity is what the client's certificate says: its Waltz role URIs and its subject. The binding of a client id
to an identity lives in ZooKeeper, one znode per client id (<root>/ids/binding/<client id>, a ClientIdentity),
written once, create-if-absent: by the server that hands the id out (GetClientId), or by the first server that
sees the id mounted (ids a client took from the ZooKeeper counter itself). Every server reads it from there, so it
holds across partition moves and server restarts; bindings never change, so a server caches them.

`decide` is the rule (pure); `ClientIdentities` applies it with a cache over a `BindingStore`, whose ZooKeeper
shell is `ZkBindingStore`. Without TLS there is no identity and nothing is checked: any client may use any id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from waltz.v1 import metadata_pb2
from waltz_common import tls
from waltz_common import zk as zkmeta

T = TypeVar("T")

ZOOKEEPER_TIMEOUT_S = 5.0
"""The longest wait for ZooKeeper while checking a client id (the stream's reader waits meanwhile); past it the
request is answered as if the partition were not ready, and the client tries again."""

CACHE_SIZE = 65536
"""Bindings a server remembers (a few hundred bytes each); one forgotten is read again from ZooKeeper."""


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who a mutual TLS peer is: its certificate's Waltz role URIs (sorted) and subject (RFC 4514)."""

    role_uris: tuple[str, ...]
    subject: str

    @classmethod
    def of_certificate(cls, pem: bytes) -> ClientIdentity:
        return cls(tuple(sorted(tls.role_uri(r) for r in tls.roles_of(pem))), tls.subject_of(pem))

    @classmethod
    def from_proto(cls, message: metadata_pb2.ClientIdentity) -> ClientIdentity:
        return cls(tuple(sorted(message.role_uris)), message.subject)

    def to_proto(self) -> metadata_pb2.ClientIdentity:
        return metadata_pb2.ClientIdentity(role_uris=list(self.role_uris), subject=self.subject)

    def describe(self) -> str:
        roles = ", ".join(u.removeprefix(tls.ROLE_URI_PREFIX) for u in self.role_uris) or "none"
        return f"role {roles}, subject {self.subject or '(empty)'}"


class Verdict(Enum):
    ALLOW = "allow"  # the caller may use the id
    BIND = "bind"  # the id is bound to nobody yet: bind it to the caller, then decide again with the winner
    DENY = "deny"  # refuse the request PERMISSION_DENIED


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    message: str = ""  # with DENY: why, for a person


ALLOW = Decision(Verdict.ALLOW)
BIND = Decision(Verdict.BIND)


def decide(
    client_id: int, caller: ClientIdentity | None, bound: ClientIdentity | None, issued_up_to: int | None
) -> Decision:
    """May caller use client_id, bound to bound (None: to nobody yet)? issued_up_to is the client id counter's
    value (None: not read, as when the id is bound already).

    Without an identity (no mutual TLS) everything is allowed: there is nothing to tell clients apart. An unbound
    id is bound to the first identity that uses it, if the counter handed it out: an id above the counter (or
    below 1) was never handed out, and binding it would let anyone claim the ids other clients take next."""
    if caller is None:
        return ALLOW
    if bound is None:
        if issued_up_to is not None and not 1 <= client_id <= issued_up_to:
            return Decision(
                Verdict.DENY,
                f"client id {client_id} was never handed out (the cluster's ids run 1 to {issued_up_to}): "
                "take a client id of your own with GetClientId",
            )
        return BIND
    if bound == caller:
        return ALLOW
    return Decision(
        Verdict.DENY,
        f"client id {client_id} belongs to another identity; this certificate ({caller.describe()}) may not "
        "mount or append under it: take a client id of your own with GetClientId",
    )


class BindingStore(Protocol):
    """Where bindings live (ZooKeeper; a dict in tests). Every method may raise on an unreachable store."""

    async def bound(self, client_id: int) -> ClientIdentity | None:
        """The identity client_id is bound to, None when unbound."""

    async def bind(self, client_id: int, identity: ClientIdentity) -> ClientIdentity:
        """Bind client_id to identity unless it is bound already; the identity it is bound to afterwards."""

    async def issued_up_to(self) -> int:
        """The client id counter's value: every id handed out so far is at most this."""


class BindingUnavailable(Exception):
    """The binding of a client id could not be read or written in time (ZooKeeper unreachable)."""


class ClientIdentities:
    """Checks client ids against their bindings: the rule, a cache of the (immutable) bindings, and the store."""

    def __init__(self, store: BindingStore, cache_size: int = CACHE_SIZE, timeout_s: float = ZOOKEEPER_TIMEOUT_S):
        self._store = store
        self._cache: OrderedDict[int, ClientIdentity] = OrderedDict()
        self._cache_size = cache_size
        self._timeout_s = timeout_s

    async def check(self, client_id: int, caller: ClientIdentity | None) -> str | None:
        """None when caller may use client_id (binding it if it was unbound); else the PERMISSION_DENIED message.
        BindingUnavailable when the store does not answer in time."""
        if caller is None:
            return None
        bound = self._cached(client_id)
        if bound is None:
            bound = await self._call(self._store.bound(client_id))
        issued = await self._call(self._store.issued_up_to()) if bound is None else None
        decision = decide(client_id, caller, bound, issued)
        if decision.verdict is Verdict.BIND:
            bound = await self._call(self._store.bind(client_id, caller))
            decision = decide(client_id, caller, bound, None)
        if bound is not None:
            self._remember(client_id, bound)
        return decision.message if decision.verdict is Verdict.DENY else None

    async def claim(self, client_id: int, caller: ClientIdentity) -> bool:
        """Bind a client id just taken from the counter to caller (GetClientId); False when another identity took
        it first (it mounted an id not handed out yet, or an earlier version bound it): take another."""
        bound = await self._call(self._store.bind(client_id, caller))
        self._remember(client_id, bound)
        return bound == caller

    def _cached(self, client_id: int) -> ClientIdentity | None:
        bound = self._cache.get(client_id)
        if bound is not None:
            self._cache.move_to_end(client_id)
        return bound

    def _remember(self, client_id: int, bound: ClientIdentity) -> None:
        self._cache[client_id] = bound
        self._cache.move_to_end(client_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _call(self, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except TimeoutError:
            raise BindingUnavailable(f"ZooKeeper did not answer within {self._timeout_s:g} s") from None
        except BindingUnavailable:
            raise
        except Exception as exc:  # kazoo's connection loss, session expiry, ...
            raise BindingUnavailable(f"{type(exc).__name__}: {exc}") from None


class ZkBindingStore:
    """Bindings in ZooKeeper: <root>/ids/binding/<client id> holding a ClientIdentity, created with the ACL of
    ids/binding (the cluster's, from `waltz cluster create`); the counter is <root>/ids/client."""

    def __init__(self, zk: KazooClient, paths: zkmeta.ZkPaths) -> None:
        self._zk = zk
        self._paths = paths

    async def bound(self, client_id: int) -> ClientIdentity | None:
        return await asyncio.to_thread(self._read, client_id)

    async def bind(self, client_id: int, identity: ClientIdentity) -> ClientIdentity:
        return await asyncio.to_thread(self._bind, client_id, identity)

    async def issued_up_to(self) -> int:
        return await asyncio.to_thread(self._counter)

    def _read(self, client_id: int) -> ClientIdentity | None:
        found = zkmeta.read(self._zk, self._paths.client_binding(client_id), metadata_pb2.ClientIdentity)
        return ClientIdentity.from_proto(found[0]) if found is not None else None

    def _bind(self, client_id: int, identity: ClientIdentity) -> ClientIdentity:
        with contextlib.suppress(NodeExistsError):  # bound meanwhile: the first binding stands
            zkmeta.create(self._zk, self._paths.client_binding(client_id), identity.to_proto())
        bound = self._read(client_id)
        if bound is None:
            raise zkmeta.MetadataError(f"{self._paths.client_binding(client_id)} vanished after it was written")
        return bound

    def _counter(self) -> int:
        return zkmeta.counter(self._zk, self._paths.client_ids)
