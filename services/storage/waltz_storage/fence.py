"""Session fencing: a partition refuses requests of any store session older than the newest one the server role
has sent it. A server-role request of a newer session raises the fence (admit), whatever its kind: a new store
session's first request (its recovery's reads) is what shuts the previous owner out before the recovery votes on
what is committed. Other callers only meet the fence (check), never raise it (waltz_storage.rules)."""

from __future__ import annotations

from waltz_storage.errors import StaleSession


class SessionFence:
    """Remembers the highest session id that set the partition's low-water mark; pure, no I/O."""

    def __init__(self, partition_id: int, highest_session_id: int = -1):
        self.partition_id = partition_id
        self._highest = highest_session_id

    @property
    def highest_session_id(self) -> int:
        return self._highest

    def check(self, session_id: int) -> None:
        """Raise StaleSession if session_id is older than the fence; a newer one is admitted, not remembered."""
        if session_id < self._highest:
            raise StaleSession(
                f"stale session {session_id}, partition {self.partition_id} is at session {self._highest}"
            )

    def admit(self, session_id: int) -> None:
        """A server-role request: check it, then raise the fence to its session."""
        self.check(session_id)
        if session_id > self._highest:
            self._highest = session_id

    def advance(self, session_id: int) -> None:
        """A session sets the low-water mark: check it, then raise the fence to it."""
        self.check(session_id)
        self._highest = session_id

    def reset(self, session_id: int) -> None:
        """An operator clears a poisoned fence (waltz storage reset-fence): back to session_id."""
        self._highest = session_id
