"""What a storage node lets a caller do to a partition, whoever asks (pure decision core, no I/O).

Who the caller is
-----------------
Under mutual TLS the storage port knows the caller's roles from its certificate (waltz_common.tls.roles_of):
the ``server`` role runs store sessions and may do anything the protocol offers; the ``operator`` role may
read, and may write only with offline requests, which the node accepts only while the partition is
unwritable (something only the admin port, operators only, can set). Without TLS the node knows nothing
but that the caller sent the right cluster key in its Open: the cluster key is the one credential, and
whoever holds it is trusted as a server (docs/security.md, "Without TLS").

What no caller may do
---------------------
The node cannot know on its own which of its transactions a majority holds, but it knows two lower bounds
of the committed prefix, and refuses any Truncate below either (CommittedDataError):

* the partition's low-water mark (control file): the high-water mark a store session's recovery resolved
  when it began. Every transaction up to it was held by a majority of the previous replica set and is part
  of every later session's log; recovery never truncates below it (the recovery core truncates a replica
  to its low-water mark, to a closing high-water mark, or to the resolved high-water mark, and each of
  these is at least the low-water mark the replica last recorded — see waltz_server.recovery);
* the committed high-water mark that the server's appends carry (StorageAppendRequest
  .committed_high_water_mark): a server sends it only once a majority acknowledged those transactions, so
  they are committed, whatever session comes next. The node keeps the highest it was told (capped at what
  it holds) in memory; after a restart of the node it falls back to the low-water mark until the next
  append tells it again (and the next recovery raises the low-water mark past it).

A SetLowWaterMark never lowers the recorded low-water mark below what the replica holds of it (a later
session's resolved high-water mark is never below an earlier one's), so the floor cannot be walked down either.
Offline requests (`waltz storage recover-partition`, on an unwritable partition) may truncate down to the
replica's local low-water mark, the prefix it held valid when its last session began: the CLI's guards check in
ZooKeeper that the replica is no voting member before it does (docs/security.md).

A low-water mark above what the replica holds
---------------------------------------------
A server of this release copies a replica up to the resolved high-water mark before it sets the low-water mark
there, so the mark is always one the replica holds. A server of the previous release (7175f3a) sets it first and
copies after, in the same session; during a rolling upgrade (docs/operations.md, "Upgrades") the node must take
that, or that server's recovery of the replica repeats the same request on every retry and in every new session
and the replica never rejoins. So the node records such a mark as it stands: its transactions were resolved by a
quorum, the replica's own log lies below it, and the floor it sets (no Truncate below it) forgets nothing. What it
would cost if it were wrong (a mistaken or forged mark, 10^6 on a replica holding 49): the replica would not
propose in the next recovery and could not be truncated, and every later session's lower mark would be refused
for ever. The last is why a mark the replica never reached may be lowered, though never below what the replica
holds: nothing it holds becomes truncatable (a Truncate below the max id stays refused), and the next session's
recovery, which copies the replica up first and then sets its own mark, takes the replica back.

The session fence is raised only by the server role: any request of a newer store session from a caller with
the server role raises it (an offline SetLowWaterMark too). It must be raised by a new session's first request,
reads included: a new owner's recovery reads each replica's log and votes on what is committed; an old owner
that is frozen, not dead, could otherwise still append a batch to a majority after those reads, see it
acknowledged and tell its clients it committed, and the recovery would then truncate it as uncommitted. With the
fence raised by the reads, that batch is refused STALE_SESSION at a majority and never acknowledged. An operator
(or any caller without the server role) only meets the fence and never raises it, so under mutual TLS a read
carrying a huge session id cannot lock the partition's sessions out. Without TLS every caller with the cluster
key is trusted as a server, and can. A poisoned fence is cleared with `waltz storage reset-fence` (admin port,
unwritable partition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from waltz_storage.errors import CommittedDataError, PermissionDenied

WRITES = frozenset({"truncate", "set_low_water_mark", "append", "repair"})


@dataclass(frozen=True, slots=True)
class Caller:
    """What the node knows of the peer of a Session stream."""

    server: bool
    operator: bool
    description: str

    @classmethod
    def from_roles(cls, roles: Iterable[str]) -> Caller:
        """A caller identified by its TLS certificate's roles."""
        held = sorted(roles)
        return cls("server" in held, "operator" in held, f"a certificate with role {', '.join(held) or 'none'}")


PLAINTEXT = Caller(server=True, operator=True, description="a plaintext caller with the cluster key")
"""Without TLS the cluster key is the only credential: its holder is trusted as a server."""


def admit_caller(caller: Caller, kind: str, offline: bool, partition_id: int) -> None:
    """Raise PermissionDenied unless caller may send this request (its partition's flags are checked apart)."""
    if caller.server:
        return
    if not caller.operator:
        raise PermissionDenied(f"partition {partition_id}: {caller.description} may not send {kind}")
    if kind in WRITES and not offline:
        raise PermissionDenied(
            f"partition {partition_id}: {kind} is an online write, which only the server role may send; "
            f"{caller.description} may only send offline requests (waltz storage recover-partition), "
            "accepted while the partition is unwritable"
        )


def truncation_floor(low_water_mark: int, local_low_water_mark: int, told_committed: int, offline: bool) -> int:
    """The lowest transaction id a Truncate may keep (see the module docstring)."""
    if offline:
        return local_low_water_mark
    return max(low_water_mark, told_committed)


def check_truncate(partition_id: int, keep: int, max_transaction_id: int, floor: int) -> None:
    """Raise CommittedDataError if truncating to keep would remove a transaction at or below floor."""
    if keep < max_transaction_id and keep < floor:
        raise CommittedDataError(
            f"partition {partition_id}: refusing to truncate to {keep}: transactions up to {floor} are committed "
            f"(low-water mark or a session's high-water mark); nothing was removed"
        )


def check_low_water_mark(partition_id: int, new: int, recorded: int, max_transaction_id: int) -> None:
    """Raise CommittedDataError if a SetLowWaterMark would lower the recorded low-water mark below what this replica
    holds of it: a recorded mark above the max transaction id (set by a previous-release server before it copied
    the replica up, or mistaken) may come down to the max, never below it (see the module docstring)."""
    floor = min(recorded, max_transaction_id)
    if new < floor:
        raise CommittedDataError(
            f"partition {partition_id}: refusing low-water mark {new}: the partition's low-water mark is already "
            f"{recorded} and it holds transactions up to {max_transaction_id}, and a later session's mark never "
            f"goes below {floor}"
        )
