"""Where a storage node runs each append: on the event loop itself, or on its partition's thread (a pure policy)."""

from __future__ import annotations

PROBE_EVERY = 32  # of consecutive appends that could all run on the loop, this many'th goes to the thread


class AppendPlacement:
    """Chooses, append by append, between the event loop and the partition's thread.

    On the loop an append costs no thread hop: no queue hand-over, no wake-up of the thread, no
    call_soon_threadsafe back, no contention for the GIL. On this class of machine those context
    switches cost more CPU than writing 100 records, so the loop is the cheap place when the node has
    nothing else to do. It blocks the loop for the append's fdatasync, though, and appends that run
    there one by one never share an fdatasync. So an append runs on the loop only when
    - the node is quiet: no work at all is queued or running on any partition thread, and the stream
      has no unanswered request of this partition (whose answer must go first), and
    - the node's previous append was for the same partition: one partition is busy, not several, which
      keep their fdatasyncs in parallel on their threads;
    and even then every PROBE_EVERY'th goes to the thread. That probe is how pipelining shows: a server
    that sends an append before the previous one is answered has its next append arrive while the
    probe is unanswered, not quiet, so its appends stay on the thread, where those that queue up share
    one fdatasync, for as long as they keep overlapping.
    """

    def __init__(self, probe_every: int = PROBE_EVERY) -> None:
        self._probe_every = probe_every
        self._last_partition: int | None = None
        self._streak = 0  # consecutive appends of _last_partition placed on the loop

    def on_loop(self, partition_id: int, quiet: bool) -> bool:
        """Place the node's next append, of partition_id: True for the loop, False for the thread."""
        last, self._last_partition = self._last_partition, partition_id
        if not quiet or last != partition_id:
            self._streak = 0
            return False
        self._streak += 1
        if self._streak >= self._probe_every:
            self._streak = 0
            return False
        return True

    def elsewhere(self, partition_id: int) -> None:
        """Any other request of partition_id went to its thread: the next append starts a new streak."""
        self._last_partition = partition_id
        self._streak = 0
