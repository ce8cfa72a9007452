"""What a fork does to clients: in the child, every client made before the fork is marked forked (its next use raises
ForkedClientError), and once a client has connected over gRPC in a process, no new gRPC client may be made in a child
forked from it (gRPC's state there is a copy whose threads stayed behind: a new channel hangs or aborts the child)."""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from waltz_client.errors import ForkedClientError


class Forkable(Protocol):
    def _forked(self) -> None: ...


_live: weakref.WeakSet[Forkable] = weakref.WeakSet()  # every client not closed
_grpc_used_in: int | None = None  # the process where a client first connected over gRPC
_grpc_forked_from: int | None = None  # in a child forked after that: gRPC cannot connect here


def track(client: Forkable) -> None:
    """A client made now: marked forked in any child forked while it is open."""
    _live.add(client)


def untrack(client: Forkable) -> None:
    """The client closed."""
    _live.discard(client)


def grpc_used() -> None:
    """A client of this process connects over gRPC (its asyncio poller then outlives the channels)."""
    global _grpc_used_in
    if _grpc_used_in is None:
        _grpc_used_in = os.getpid()


def check_new_grpc_client() -> None:
    """ForkedClientError if this process was forked after a client had connected over gRPC in its parent."""
    if _grpc_forked_from is not None:
        raise ForkedClientError(_grpc_forked_from, new_client=True)


def _after_fork_in_child() -> None:
    """Touches none of the parent's gRPC objects: only marks. gRPC's own fork support does not help: with its streams
    open it skips its fork handlers ("Other threads are currently calling into gRPC"), GRPC_ENABLE_FORK_SUPPORT or not
    (docs/web-services.md)."""
    global _grpc_forked_from
    if _grpc_used_in is not None:
        _grpc_forked_from = _grpc_used_in
    for client in list(_live):
        client._forked()
    _live.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
