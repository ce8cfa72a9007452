"""Where a storage node runs each append: on the event loop itself, or on its partition's thread (a pure policy)."""

from __future__ import annotations

PROBE_EVERY = 32  # appends on the loop in a row before one goes to the thread; appends on the thread after an overlap
SLOW_APPEND_S = 0.1  # an append on the loop that took longer (a struggling disk, not a busy moment) ...
SLOW_BACKOFF = 1000  # ... sends this many of the next appends to the thread


class AppendPlacement:
    """Chooses, append by append, between the event loop and the partition's thread.

    On the loop an append costs no thread hop: no queue hand-over, no wake-up of the thread, no
    call_soon_threadsafe back, no contention for the GIL. On this class of machine those context
    switches cost about as much CPU as writing 100 records, so the loop is the cheap place when the node
    has nothing else to do. It blocks the loop for the append's fdatasync, though, and appends that run
    there one by one never share an fdatasync. So an append runs on the loop only when
    - the node is quiet: no work at all is queued or running on any partition thread, and the stream
      has answered everything before it (whose answers must go first),
    - the node's previous append was for the same partition: one partition is busy, not several, which
      keep their fdatasyncs in parallel on their threads, and
    - none of the node's last PROBE_EVERY appends overlapped (arrived while the node was not quiet);
    and even then every PROBE_EVERY'th in a row goes to the thread. That probe is how pipelining shows:
    a server that sends an append before the previous one is answered has its next append arrive while
    the probe is unanswered, so its appends stay on the thread, where those that queue up share one
    fdatasync, for as long as they keep overlapping. And an append on the loop that took longer than
    SLOW_APPEND_S (a struggling disk) sends the next SLOW_BACKOFF to the thread: the loop, which also
    answers health checks and admin calls, is blocked that long at most once in so many appends.
    """

    def __init__(self, probe_every: int = PROBE_EVERY) -> None:
        self._probe_every = probe_every
        self._last_partition: int | None = None
        self._streak = 0  # > 0: appends on the loop in a row; <= 0: appends still to go to the thread, negated

    def on_loop(self, partition_id: int, quiet: bool) -> bool:
        """Place the node's next append, of partition_id: True for the loop, False for the thread."""
        last, self._last_partition = self._last_partition, partition_id
        if not quiet:
            self._streak = min(self._streak, -self._probe_every)
            return False
        if last != partition_id:
            self._streak = min(self._streak, 0)
            return False
        self._streak += 1
        if self._streak <= 0:
            return False
        if self._streak >= self._probe_every:
            self._streak = 0
            return False
        return True

    def inline(self, partition_id: int, idle: bool) -> bool:
        """Place the node's next appends of partition_id, all that arrived together on a stream that hands them
        over as they arrive (the framed session port): True for the loop, False for the thread. idle: no work
        is queued or running on any partition thread.

        No probe here: the caller serves everything that has arrived as one run, so appends a pipelining
        server sent while the loop was in an fdatasync come together and share the next one, as on the thread.
        The loop is left to the thread only while another partition is busy (their fdatasyncs go on in
        parallel there), for the first append after another partition's, and after a slow append (took)."""
        last, self._last_partition = self._last_partition, partition_id
        if not idle or last != partition_id:
            self._streak = min(self._streak, 0)
            return False
        if self._streak < 0:
            self._streak += 1
            return False
        return True

    def took(self, seconds: float) -> None:
        """How long the appends just placed on the loop took there."""
        if seconds > SLOW_APPEND_S:
            self._streak = -SLOW_BACKOFF

    def elsewhere(self, partition_id: int) -> None:
        """Any other request of partition_id went to its thread: the next append starts a new streak."""
        self._last_partition = partition_id
        self._streak = min(self._streak, 0)
