"""The sequence-number rule of appends and the window of recent commits that answers re-sent appends.

The rule (docs/protocol.md, common.proto ReqId.seq_num): per client id and partition, each append carries a
sequence number after the one of every earlier append of that client on that partition, in 32-bit serial number
arithmetic (RFC 1982): b is after a when (b - a) mod 2^32 is in [1, 2^31). So numbers may wrap from 2^31-1 to
-2^31, and neither a new generation nor a remount nor a new stream resets them. An append whose number is not after
the last one is either a re-send of a committed append (answered ALREADY_COMMITTED with its transaction id, and not
committed again) or refused (SEQUENCE_NOT_INCREASING).

The server knows a client's last number from the appends it saw since the partition opened here and from the
partition's last `window` transactions, which a new owner reads from the log's tail when it opens the partition
(server.resendWindow). Memory is bounded by the window: one entry per transaction in it, and one per client that
appears in it or has appends queued here. A re-send is recognised while its original is among the last `window`
transactions; an older one is refused when the client's later appends are still remembered, and would commit
again only after the client was silent on the partition for a whole window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_MASK = 0xFFFFFFFF
_HALF = 0x80000000


def is_after(last: int, seq: int) -> bool:
    """seq comes after last in 32-bit serial number arithmetic."""
    return 0 < (seq - last) & _MASK < _HALF


@dataclass(frozen=True, slots=True)
class Resend:
    """What a sequence number that is not after the client's last one is: committed as transaction_id, or not
    (transaction_id None: refuse it)."""

    last_seq_num: int
    transaction_id: int | None


class SequenceWindow:
    """Per partition: each client's last sequence number and the ReqIds of the last `window` transactions."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("the re-send window must hold at least one transaction")
        self.window = window
        self.last: dict[int, int] = {}
        """client id -> the last sequence number admitted (read directly by the append hot path)."""
        self._recent: deque[tuple[int, int, int]] = deque(maxlen=window)  # (client id, seq, transaction id)
        self.record: Callable[[tuple[int, int, int]], None] = self._recent.append
        """Remember a commit (client id, sequence number, transaction id), in id order; then forget_silent()."""

    def admit(self, client_id: int, seq_num: int) -> bool:
        """Take seq_num as the client's last if it comes after the last one; False (nothing changes) if not."""
        last = self.last.get(client_id)
        if last is None or 0 < (seq_num - last) & _MASK < _HALF:
            self.last[client_id] = seq_num
            return True
        return False

    def forget_silent(self, pending: Callable[[int], object]) -> None:
        """Bound the clients remembered: past twice the window, keep those in it or with appends pending."""
        if len(self.last) > 2 * self.window:
            present = {client_id for client_id, _, _ in self._recent}
            kept = {c: s for c, s in self.last.items() if c in present or pending(c)}
            self.last.clear()  # in place: the append hot path holds the dict
            self.last.update(kept)

    def classify(self, client_id: int, seq_num: int) -> Resend:
        """A number admit() refused: the transaction it committed as, if it is in the window."""
        for c, s, transaction_id in reversed(self._recent):
            if c == client_id and s == seq_num:
                return Resend(self.last[client_id], transaction_id)
        return Resend(self.last.get(client_id, seq_num), None)

    def rebuild(self, tail: Iterable[tuple[int, int, int]]) -> None:
        """Start from the log's last transactions (client id, sequence number, transaction id), oldest first."""
        self._recent.clear()
        self.last.clear()
        for client_id, seq_num, transaction_id in tail:
            self._recent.append((client_id, seq_num, transaction_id))
            last = self.last.get(client_id)
            if last is None or is_after(last, seq_num):
                self.last[client_id] = seq_num

    def __len__(self) -> int:
        return len(self._recent)
