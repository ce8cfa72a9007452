"""RecoveryManager over random session histories: no acknowledged transaction lost, recovered replicas agree."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.server.recovery_harness import Driver, FakeStorage
from waltz_server.recovery import RecoveryManager, ReplicaState


@dataclass(frozen=True)
class SessionPlan:
    online: tuple[bool, ...]
    recovery_steps: int  # actions carried out before the session gives up (a crash or a timeout)
    drop: tuple[int, int] | None  # (step, replica index): that replica disconnects during recovery
    metadata_written: bool  # False: the server dies before writing the partition metadata
    batches: tuple[tuple[bool, ...], ...]  # per append batch, which writers acknowledge it


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[SessionPlan]]:
    n = draw(st.sampled_from([3, 5]))
    mostly = st.sampled_from([True, True, True, False])
    flags = st.tuples(*[mostly] * n)
    plan = st.builds(
        SessionPlan,
        online=flags,
        recovery_steps=st.integers(0, 40) | st.just(100),
        drop=st.none() | st.tuples(st.integers(0, 20), st.integers(0, n - 1)),
        metadata_written=mostly,
        batches=st.lists(flags, max_size=4).map(tuple),
    )
    return n, draw(st.lists(plan, min_size=1, max_size=6))


class Cluster:
    """One partition's replicas, its metadata and what was acknowledged to clients."""

    def __init__(self, n: int) -> None:
        self.names = [f"10.0.0.{i}:6000" for i in range(n)]
        self.storages = {r: FakeStorage([]) for r in self.names}
        self.metadata: dict[str, ReplicaState] = {}
        self.session = 0
        self.agreed: list[str] = []  # the log up to the last resolved mark, plus acknowledged appends
        self.acknowledged = -1

    def run_session(self, plan: SessionPlan, unlimited: bool = False) -> bool:
        self.session += 1
        driver = Driver(RecoveryManager(self.session, self.metadata, self.names), self.storages)
        driver.connect(*(r for r, up in zip(self.names, plan.online, strict=True) if up))
        for step in range(10_000 if unlimited else plan.recovery_steps):
            if plan.drop is not None and step == plan.drop[0] and not unlimited:
                driver.disconnect(self.names[plan.drop[1]])
            if not driver.step():
                break
        decision = driver.manager.decide()
        assert decision == driver.manager.decide()
        if decision.high_water_mark is not None:
            assert decision.high_water_mark >= self.acknowledged, "an acknowledged transaction was lost"
        for r in decision.recovered:
            log = self.storages[r].log
            assert len(log) == decision.high_water_mark + 1
            assert log[: len(self.agreed)] == self.agreed, "an agreed transaction changed"
            assert log == self.storages[min(decision.recovered)].log
        if not decision.complete or not (plan.metadata_written or unlimited):
            return False
        assert decision.replica_states is not None
        self.metadata = dict(decision.replica_states)
        writers = sorted(r for r in decision.recovered if r in driver.online)
        self.agreed = list(self.storages[min(decision.recovered)].log)
        self._append(writers, plan.batches)
        return True

    def _append(self, writers: list[str], batches: tuple[tuple[bool, ...], ...]) -> None:
        """Each batch goes to every writer; it commits on a quorum; any missing ack ends the session."""
        quorum = len(self.names) // 2 + 1
        for acks in batches:
            first = len(self.agreed)
            batch = [f"s{self.session}-{first + i}" for i in range(2)]
            acked = [w for w, ok in zip(writers, acks, strict=False) if ok]
            for w in acked:
                self.storages[w].log.extend(batch)
            if len(acked) >= quorum:
                self.agreed.extend(batch)
                self.acknowledged = len(self.agreed) - 1
            if len(acked) < len(writers):
                return


@settings(max_examples=150, deadline=None)
@given(histories())
def test_random_histories_never_lose_acknowledged_transactions(history: tuple[int, list[SessionPlan]]) -> None:
    n, plans = history
    cluster = Cluster(n)
    for plan in plans:
        cluster.run_session(plan)
    # With every replica back, recovery always completes and all replicas agree.
    everyone = SessionPlan((True,) * n, 0, None, True, ())
    assert cluster.run_session(everyone, unlimited=True)
    logs = {tuple(s.log) for s in cluster.storages.values()}
    assert len(logs) == 1
    assert list(logs.pop())[: cluster.acknowledged + 1] == cluster.agreed[: cluster.acknowledged + 1]
