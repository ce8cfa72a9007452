"""A storage node's health (pure): the partitions whose writes fail on the disk, and what its grpc.health.v1
names report. docs/operations.md, "Health and probes", says which probe asks which name.

Ready means every partition ZooKeeper assigns the node is open here and caught up: a wiped node, which holds none
of its partitions until `waltz storage sync` creates them and a server's store session fills them, is not ready, so
a Kubernetes rollout waits for it (ZkView, read by waltz_storage.zk_view)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from waltz_common.health import Verdict

SERVICE = "waltz.v1.WaltzStorage"
ADMIN_SERVICE = "waltz.v1.WaltzStorageAdmin"
LIVE = f"{SERVICE}/live"
"""SERVING while the process serves (until it begins shutting down): a liveness probe."""
READY_NAMES = ("", SERVICE, ADMIN_SERVICE)
"""SERVING when every assigned partition (here, and in ZooKeeper) is open and caught up and none has a failing
write (a readiness probe)."""


@dataclass(frozen=True, slots=True)
class ZkView:
    """What ZooKeeper said of this node's replicas when last read: the partitions it assigns the node, and those
    on which the node's replica holds what is committed (waltz_storage.zk_view.caught_up: the latest store session
    counts it in)."""

    assigned: frozenset[int]
    caught_up: frozenset[int]


def partition_name(partition_id: int) -> str:
    """The health name of one assigned partition: SERVING when it is open and no write failed since its last append
    that succeeded."""
    return f"{SERVICE}/partition/{partition_id}"


def is_disk_failure(exc: BaseException) -> bool:
    """Whether a failed write failed on the disk (an OSError, maybe wrapped), rather than being refused."""
    return isinstance(exc, OSError) or isinstance(exc.__cause__, OSError)


class WriteFailures:
    """The partitions whose writes (append, truncate, low-water mark) fail on the disk, with the last error; the next
    append of the partition that succeeds clears it (a truncate or a control-file update, which do not grow a file,
    can succeed on a full disk). Partition threads and the loop both record: one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[int, str] = {}

    def failed(self, partition_id: int, exc: BaseException) -> None:
        with self._lock:
            self._failures[partition_id] = str(exc) or type(exc).__name__

    def succeeded(self, partition_id: int) -> None:
        if partition_id in self._failures:  # the common case costs no lock
            with self._lock:
                self._failures.pop(partition_id, None)

    def get(self, partition_id: int) -> str:
        """The partition's failing write's error, or empty."""
        with self._lock:
            return self._failures.get(partition_id, "")

    def snapshot(self) -> dict[int, str]:
        with self._lock:
            return dict(self._failures)


def storage_verdicts(
    assigned: Sequence[int],
    open_failures: Mapping[int, str],
    write_failures: Mapping[int, str],
    zookeeper: ZkView | None = None,
) -> dict[str, Verdict]:
    """Every health name of a running node, from its assigned partitions, those that could not be opened, those
    whose writes fail (a failure of a partition no longer assigned does not count) and, when known, what ZooKeeper
    assigns it and which of those it is caught up on."""
    verdicts = {LIVE: Verdict(True)}
    failing = []
    held = set(assigned)
    wanted = zookeeper.assigned if zookeeper is not None else frozenset()
    for pid in sorted(held | wanted):
        if pid in open_failures:
            verdict = Verdict(False, f"cannot be opened: {open_failures[pid]}")
        elif pid in write_failures:
            verdict = Verdict(False, f"writes fail: {write_failures[pid]}")
        elif pid not in held:
            verdict = Verdict(False, "assigned to this node in ZooKeeper but not held here (a wiped or new node: "
                                     "`waltz storage sync` creates it, then a server's store session fills it)")
        elif zookeeper is not None and pid in wanted and pid not in zookeeper.caught_up:
            verdict = Verdict(False, "not caught up: the partition's latest store session does not count this "
                                     "replica in (a server is copying it what it lacks, or no server reached it)")
        else:
            verdict = Verdict(True)
        verdicts[partition_name(pid)] = verdict
        if not verdict.serving:
            failing.append(f"partition {pid} {verdict.reason}")
    ready = Verdict(not failing, "; ".join(failing))
    verdicts.update({name: ready for name in READY_NAMES})
    return verdicts
