"""Client-side bookkeeping of one partition: ReqId generation, mount state and the in-order apply gate."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from waltz_common.types import INT32_MAX, INT32_MIN, ReqId


class MountState(Enum):
    UNMOUNTED = "unmounted"
    MOUNTING = "mounting"
    MOUNTED = "mounted"
    CLIENT_AHEAD = "client_ahead"  # client hwm above the partition's: a configuration error
    PERMISSION_DENIED = "permission_denied"  # the client id belongs to another identity (mutual TLS)


class MountResult(Enum):
    """The server's answer to a mount request (original MountResponse.partitionState)."""

    READY = "ready"
    NOT_READY = "not_ready"
    CLIENT_AHEAD = "client_ahead"
    PERMISSION_DENIED = "permission_denied"


class FeedDecision(Enum):
    APPLY = "apply"  # transaction_id == client hwm + 1
    SKIP_DUPLICATE = "skip_duplicate"  # already applied (replayed after a reconnect)
    GAP = "gap"  # a transaction is missing: remount


def _check_int32(name: str, value: int) -> None:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{name} {value} is outside the signed 32-bit range")


class ClientPartitionState:
    """What a client knows about one partition; no I/O.

    Shell usage, per partition:
      1. (Re)connect: `on_disconnect()` if mounted before, then `req = begin_mount()`; send
         MountRequest(req, client_hwm). Appends are blocked until `appends_allowed`.
      2. Every FeedData (also while MOUNTING): `accept_feed(txn_id, client_hwm)`:
         APPLY -> hand to the monitor and the application; SKIP_DUPLICATE -> drop;
         GAP -> the state is now UNMOUNTED, start again at 1.
      3. MountResponse: `on_mount_response(req_id, result)`; False means stale, ignore it.
         READY -> MOUNTED (then call the monitor's `on_mount_complete()`); NOT_READY ->
         UNMOUNTED (retry after a delay); CLIENT_AHEAD, PERMISSION_DENIED -> sticky error, surface it. A later
         NOT_READY for the mount that was answered READY (the server ended the feed) also
         unmounts: retry after a delay.
      4. Each append: `req = next_req_id()`, register it with the monitor, send it.
      5. New partition ownership: `update_generation(g)`; True means a remount is needed.

    Sequence numbers (`last_seq_num` is the last one used) never reset, not even on a
    generation change, and wrap from int32 max to int32 min, so within a partition they order
    the ReqIds this client created; the monitor's flush rule relies on that.
    """

    def __init__(
        self, client_id: int, partition_id: int, generation: int = 0, last_seq_num: int = 0
    ) -> None:
        for name, value in (("client_id", client_id), ("partition_id", partition_id),
                            ("generation", generation), ("last_seq_num", last_seq_num)):
            _check_int32(name, value)
        self.client_id = client_id
        self.partition_id = partition_id
        self._generation = generation
        self._seq_num = last_seq_num
        self._mount_state = MountState.UNMOUNTED
        self.appends_allowed = False  # MOUNTED; an attribute, not a property: read for every append
        self._mount_req_id: ReqId | None = None  # the mount awaiting its answer
        self._mounted_by: ReqId | None = None  # the mount that made the partition MOUNTED

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def mount_state(self) -> MountState:
        return self._mount_state

    def _enter(self, state: MountState) -> None:
        self._mount_state = state
        self.appends_allowed = state is MountState.MOUNTED

    def next_req_id(self) -> ReqId:
        """A fresh ReqId with the current generation and the next sequence number."""
        return ReqId(self.client_id, self._generation, self.partition_id, self.next_seq_num())

    def next_seq_num(self) -> int:
        """The next sequence number, for a ReqId with the current generation (next_req_id without the ReqId)."""
        seq = self._seq_num
        self._seq_num = seq = INT32_MIN if seq == INT32_MAX else seq + 1  # wraps
        return seq

    def next_seq_nums(self, count: int) -> Sequence[int]:
        """next_seq_num() count times."""
        seq = self._seq_num
        if seq + count > INT32_MAX:
            return [self.next_seq_num() for _ in range(count)]
        self._seq_num = seq + count
        return range(seq + 1, seq + count + 1)

    def update_generation(self, generation: int) -> bool:
        """Adopt a newer generation; True if it changed, which ends any mount (remount)."""
        _check_int32("generation", generation)
        if generation <= self._generation:
            return False
        self._generation = generation
        if self._mount_state in (MountState.MOUNTING, MountState.MOUNTED):
            self.on_disconnect()
        return True

    def begin_mount(self) -> ReqId:
        """Start mounting from UNMOUNTED (or retry after CLIENT_AHEAD or PERMISSION_DENIED); returns the mount
        ReqId."""
        if self._mount_state in (MountState.MOUNTING, MountState.MOUNTED):
            raise RuntimeError(f"cannot mount partition {self.partition_id}: {self._mount_state.value}")
        self._mount_req_id = self.next_req_id()
        self._enter(MountState.MOUNTING)
        return self._mount_req_id

    def on_mount_response(self, req_id: ReqId, result: MountResult) -> bool:
        """Apply the answer to the current mount; False (nothing changes) if it is stale.

        A NOT_READY while MOUNTED, for the mount that made this partition MOUNTED or for a request made under it
        (a flush), is the server saying the mount no longer holds there: it closed the partition and ended the
        feed, or the partition there is not the one mounted (moved, reopened at another generation). UNMOUNTED,
        to mount again after a delay. A NOT_READY for an earlier mount changes nothing."""
        if self._mount_state is MountState.MOUNTED and result is MountResult.NOT_READY:
            if self._mounted_by is None or not _made_since(self._mounted_by, req_id):
                return False
            self.on_disconnect()
            return True
        if self._mount_state is not MountState.MOUNTING or req_id != self._mount_req_id:
            return False
        self._mount_req_id = None
        self._mounted_by = req_id if result is MountResult.READY else None
        self._enter({
            MountResult.READY: MountState.MOUNTED,
            MountResult.NOT_READY: MountState.UNMOUNTED,
            MountResult.CLIENT_AHEAD: MountState.CLIENT_AHEAD,
            MountResult.PERMISSION_DENIED: MountState.PERMISSION_DENIED,
        }[result])
        return True

    def on_disconnect(self) -> None:
        """The connection to the partition's server is gone (or unusable): block appends."""
        if self._mount_state not in _STICKY:
            self._enter(MountState.UNMOUNTED)
        self._mount_req_id = self._mounted_by = None

    def accept_feed(self, transaction_id: int, client_high_water_mark: int) -> FeedDecision:
        """Whether a fed transaction is the next one to apply; a gap also unmounts."""
        if transaction_id <= client_high_water_mark:
            return FeedDecision.SKIP_DUPLICATE
        if transaction_id == client_high_water_mark + 1:
            return FeedDecision.APPLY
        self.on_disconnect()
        return FeedDecision.GAP


_STICKY = (MountState.CLIENT_AHEAD, MountState.PERMISSION_DENIED)


def _made_since(mount: ReqId, req_id: ReqId) -> bool:
    """req_id is the mount's or was made after it, under it (same generation; sequence numbers wrap)."""
    return (
        req_id.client_id == mount.client_id
        and req_id.partition_id == mount.partition_id
        and req_id.generation == mount.generation
        and (req_id.seq_num - mount.seq_num) & 0xFFFFFFFF < 2**31
    )
