"""In-memory replicas and a driver that carries out a RecoveryManager's actions, as a shell would."""

from __future__ import annotations

from dataclasses import dataclass, field

from waltz_server.recovery import (
    UNRESOLVED,
    CatchUp,
    RecoveryDecision,
    RecoveryManager,
    Repair,
    ReplicaAction,
    ReplicaFacts,
    SetLowWaterMark,
    Truncate,
)

CATCH_UP_BATCH = 20  # as the original's recovery
SESSION = 999  # the session that recovers
U = UNRESOLVED


def replica(i: int) -> str:
    return f"127.0.0.1:{5000 + i}"


A, B, C, D, E = (replica(i) for i in range(5))


@dataclass
class FakeStorage:
    """One replica of the partition: its log (a content tag per transaction id) and its session info."""

    log: list[str]
    session_id: int = -1
    low_water_mark: int = -1
    damaged: set[int] = field(default_factory=set)  # ids whose records fail their checksums here
    told_committed: int = -1  # the highest high-water mark an append told the node (memory only)

    @property
    def committed_high_water_mark(self) -> int:
        """The node's truncation floor (waltz_storage.rules.truncation_floor, online)."""
        return max(self.low_water_mark, min(self.told_committed, self.max_transaction_id))

    @classmethod
    def with_records(cls, session_id: int, low_water_mark: int, max_transaction_id: int, tag: str = "t",
                     told_committed: int = -1):
        return cls([f"{tag}{i}" for i in range(max_transaction_id + 1)], session_id, low_water_mark,
                   told_committed=told_committed)

    @property
    def max_transaction_id(self) -> int:
        return len(self.log) - 1

    def facts(self) -> ReplicaFacts:
        return ReplicaFacts(self.session_id, self.low_water_mark, -1, self.max_transaction_id, frozenset(self.damaged),
                            self.committed_high_water_mark)


@dataclass
class Driver:
    """Runs one action at a time (first replica in name order that has one) and reports the result."""

    manager: RecoveryManager
    storages: dict[str, FakeStorage]
    online: set[str] = field(default_factory=set)
    performed: list[tuple[str, ReplicaAction]] = field(default_factory=list)

    def connect(self, *replicas: str) -> None:
        for replica in sorted(replicas):
            self.online.add(replica)
            self.manager.replica_online(replica, self.storages[replica].facts())

    def disconnect(self, *replicas: str) -> None:
        for replica in sorted(replicas):
            self.online.discard(replica)
            self.manager.replica_offline(replica)

    def step(self) -> bool:
        """Carry out one action; False when every online replica waits or is recovered."""
        decision = self.manager.decide()
        for replica in sorted(self.online):
            action = decision.actions[replica]
            if isinstance(action, Truncate | SetLowWaterMark | CatchUp | Repair):
                self._perform(replica, action)
                self.performed.append((replica, action))
                return True
        return False

    def run(self, max_steps: int = 10_000) -> RecoveryDecision:
        for _ in range(max_steps):
            if not self.step():
                break
        return self.manager.decide()

    def _perform(self, replica: str, action: ReplicaAction) -> None:
        storage = self.storages[replica]
        match action:
            case Truncate(transaction_id):
                # the node refuses (COMMITTED_DATA) to cut what appends told it committed (waltz_storage.rules;
                # its low-water mark is a floor too, which older cases here use as stale data of a recreated
                # cluster's metadata, where an operator truncates offline)
                told = min(storage.told_committed, storage.max_transaction_id)
                assert transaction_id >= storage.max_transaction_id or transaction_id >= told, (replica, action, told)
                del storage.log[transaction_id + 1 :]
                storage.damaged = {t for t in storage.damaged if t <= transaction_id}
                self.manager.replica_progress(replica, storage.max_transaction_id)
            case Repair(source, transaction_ids):
                assert source in self.online and source != replica
                copy = self.storages[source]
                for txn in transaction_ids:
                    assert txn in storage.damaged and txn not in copy.damaged, (replica, action)
                    assert copy.log[txn] == storage.log[txn], (replica, action)  # the node checks the checksum
                    storage.damaged.discard(txn)
                self.manager.replica_damage(replica, storage.damaged)
            case SetLowWaterMark(low_water_mark):
                # this release sets the mark only once the replica holds it (waltz_storage.rules: a previous
                # release's server set it before copying the replica up, which the storage node still takes)
                assert low_water_mark <= storage.max_transaction_id, (replica, action)
                storage.session_id = self.manager.session_id
                storage.low_water_mark = low_water_mark
                self.manager.low_water_mark_set(replica)
            case CatchUp(source, first, last):
                assert source in self.online and source != replica
                assert first == len(storage.log), (replica, action, storage.max_transaction_id)
                end = min(last, first + CATCH_UP_BATCH - 1)
                records = self.storages[source].log[first : end + 1]
                assert len(records) == end - first + 1, (replica, action)
                assert not self.storages[source].damaged & set(range(first, end + 1)), (replica, action)  # CORRUPTED
                storage.log.extend(records)
                self.manager.replica_progress(replica, storage.max_transaction_id)
