"""Session fencing: a partition refuses requests of any store session older than the newest it has seen."""

from __future__ import annotations

from waltz_storage.errors import StaleSession


class SessionFence:
    """Remembers the highest session id seen for one partition; pure, no I/O."""

    def __init__(self, partition_id: int, highest_session_id: int = -1):
        self.partition_id = partition_id
        self._highest = highest_session_id

    @property
    def highest_session_id(self) -> int:
        return self._highest

    def check(self, session_id: int) -> None:
        """Admit session_id (raising the fence if it is newer) or raise StaleSession if it is older."""
        if session_id < self._highest:
            raise StaleSession(
                f"stale session {session_id}, partition {self.partition_id} is at session {self._highest}"
            )
        self._highest = session_id
