"""Which client stream each client mounted a partition from: newer mounts make older streams stale."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mount:
    stream_id: int
    generation: int
    seq_num: int


class MountRegistry:
    """Per partition: client id -> the stream of its newest mount (original: stale network clients).

    A mount from (generation, seq_num) at least as new as the registered one replaces it, so the
    newest network client of a client wins; appends and feeds from any other stream are ignored.
    """

    def __init__(self) -> None:
        self._mounts: dict[int, Mount] = {}

    def register(self, client_id: int, stream_id: int, generation: int, seq_num: int) -> tuple[bool, int | None]:
        """(accepted, the stream id it replaced if another one); a stale mount is not accepted."""
        current = self._mounts.get(client_id)
        if current is not None and (generation, seq_num) < (current.generation, current.seq_num):
            return False, None
        self._mounts[client_id] = Mount(stream_id, generation, seq_num)
        replaced = current.stream_id if current is not None and current.stream_id != stream_id else None
        return True, replaced

    def is_current(self, client_id: int, stream_id: int) -> bool:
        mount = self._mounts.get(client_id)
        return mount is not None and mount.stream_id == stream_id

    def is_known(self, client_id: int) -> bool:
        return client_id in self._mounts

    def remove_stream(self, stream_id: int) -> list[int]:
        """Forget the mounts of a closed stream; returns their client ids."""
        gone = [cid for cid, m in self._mounts.items() if m.stream_id == stream_id]
        for cid in gone:
            del self._mounts[cid]
        return gone

    def __len__(self) -> int:
        return len(self._mounts)
