"""What a server's grpc.health.v1 names report (pure): readiness, liveness, and whether each owned partition can
commit. docs/operations.md, "Health and probes", says which probe asks which name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from waltz_common.health import Verdict

SERVICE = "waltz.v1.WaltzServer"
LIVE = f"{SERVICE}/live"
"""SERVING while the process serves (until it begins shutting down): a liveness probe."""
PARTITIONS = f"{SERVICE}/partitions"
"""SERVING when every partition this server owns can commit."""
READY_NAMES = ("", SERVICE)
"""SERVING once the server joined the cluster (took its id, registered in ZooKeeper), also while ZooKeeper is
unreachable afterwards: its partitions go on serving meanwhile (a readiness probe)."""


def identity_name(server_id: int) -> str:
    """SERVING for as long as this process runs as server_id. Peers probe it (peers.py): another process
    answering at the address (NOT_FOUND for this name) proves the registration's process is gone."""
    return f"{SERVICE}/server/{server_id}"


def partition_name(partition_id: int) -> str:
    """The health name of one owned partition: SERVING when it can commit."""
    return f"{SERVICE}/partition/{partition_id}"


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    """An owned partition as GetServerPartitions reports it: can it commit, and if not, why."""

    partition_id: int
    healthy: bool
    detail: str


def server_verdicts(
    joined: bool, partitions: Sequence[PartitionHealth], server_id: int = -1
) -> dict[str, Verdict]:
    """Every health name of a running server, from whether it joined the cluster, its owned partitions and its
    server id (-1: not taken yet). A ZooKeeper outage after joining changes none of them: owned partitions
    commit through it (docs/failover.md, "ZooKeeper outages")."""
    ready = Verdict(True) if joined else Verdict(False, "not registered in ZooKeeper yet")
    verdicts = {name: ready for name in READY_NAMES}
    verdicts[LIVE] = Verdict(True)
    if server_id >= 0:
        verdicts[identity_name(server_id)] = Verdict(True)
    failing = []
    for p in partitions:
        if p.healthy:
            verdict = Verdict(True)
        else:
            verdict = Verdict(False, p.detail or "cannot commit")
            failing.append(f"partition {p.partition_id}: {verdict.reason}")
        verdicts[partition_name(p.partition_id)] = verdict
    verdicts[PARTITIONS] = Verdict(not failing, "; ".join(failing))
    return verdicts
