"""Monitor and partition state against a simulated lossy server: outcomes match the log."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.monitor import Outcome, OutcomeKind, TransactionMonitor
from waltz_client.partition_state import ClientPartitionState, FeedDecision, MountResult
from waltz_common.types import ReqId


class Simulation:
    """One client, one partition; the server may lose, lock-fail or refuse appends."""

    def __init__(self) -> None:
        self.state = ClientPartitionState(client_id=7, partition_id=0)
        self.monitor = TransactionMonitor[int](max_concurrent=3)
        self.log: list[ReqId] = []  # committed transactions; index = transaction id
        self.inbox: deque[tuple[str, ReqId]] = deque()  # client -> server, in order
        self.pipeline: deque[ReqId] = deque()  # accepted, not yet committed
        self.outbox: deque[tuple[str, ReqId, int]] = deque()  # server -> client, in order
        self.feed: deque[tuple[str, ReqId, int]] = deque()  # in order, but may lag the outbox
        self.hwm = -1
        self.last_seq = 0  # the highest sequence number the server admitted
        self.req_ids: list[ReqId] = []
        self.outcomes: dict[int, list[tuple[Outcome, int]]] = {}
        self.now = 0.0
        self.remount(commit=0)

    def record(self, resolved: list[tuple[int, Outcome]]) -> None:
        for token, outcome in resolved:
            self.outcomes.setdefault(token, []).append((outcome, self.hwm))

    def step(self, action: int, choice: int) -> None:
        self.now += 1.0
        if action == 0 and self.state.appends_allowed and self.monitor.has_capacity():
            req = self.state.next_req_id()
            self.monitor.register(req, len(self.req_ids), self.now)
            self.req_ids.append(req)
            self.inbox.append(("append", req))
        elif action == 1 and self.inbox:
            self.server_takes(choice)
        elif action == 2 and self.pipeline:
            self.commit()
        elif action == 3:
            self.pipeline.clear()  # a storage failure ends the session: in-flight appends are lost
        elif action == 4 and (self.outbox or self.feed):
            queue = self.outbox if (choice % 2 == 0 and self.outbox) or not self.feed else self.feed
            self.deliver(*queue.popleft())
        elif action == 5 and self.monitor.oldest_pending_age(self.now) is not None:
            target = self.monitor.flush_target()
            assert target is not None
            self.inbox.append(("flush", target))
        elif action == 6:
            self.remount(commit=choice)

    def server_takes(self, choice: int) -> None:
        kind, req = self.inbox[0]
        if kind == "flush":
            if not self.pipeline:
                self.inbox.popleft()
                self.outbox.append(("flushed", req, len(self.log) - 1))
            return
        self.inbox.popleft()
        if choice == 1:
            return  # lost on the way: the server never saw it
        if req.seq_num <= self.last_seq:  # a re-send: answered from the log, never committed twice
            committed = [txn for txn, r in enumerate(self.log) if r.seq_num == req.seq_num]
            if committed:
                self.outbox.append(("already", req, committed[0]))
            else:
                self.outbox.append(("refused", req, 0))
            return
        if choice == 3:
            self.outbox.append(("rejected", req, 0))  # refused before its sequence number was admitted
            return
        self.last_seq = req.seq_num
        if choice == 0 or (choice == 2 and not self.log):
            self.pipeline.append(req)
        else:
            self.outbox.append(("lock", req, len(self.log) // 2))

    def commit(self) -> None:
        req = self.pipeline.popleft()
        self.log.append(req)
        self.feed.append(("feed", req, len(self.log) - 1))

    def deliver(self, kind: str, req: ReqId, value: int) -> None:
        if kind == "feed":
            decision = self.state.accept_feed(value, self.hwm)
            assert decision is not FeedDecision.GAP
            self.record(self.monitor.on_feed(req, value))
            if decision is FeedDecision.APPLY:
                self.hwm = value
                self.record(self.monitor.on_client_high_water_mark(value))
        elif kind == "lock":
            self.record(self.monitor.on_lock_failure(req, value))
        elif kind == "flushed":
            self.record(self.monitor.on_flush_response(req, value, self.hwm))
        elif kind == "already":
            self.record(self.monitor.on_rejected(req, "ALREADY_COMMITTED", value))
        elif kind == "refused":
            self.record(self.monitor.on_rejected(req, "SEQUENCE_NOT_INCREASING"))
        else:
            self.record(self.monitor.on_rejected(req, "PARTITION_NOT_READY"))

    def remount(self, commit: int) -> None:
        """Reconnect: the old stream's messages are gone, the server settles its in-flight appends."""
        self.state.on_disconnect()
        self.inbox.clear()
        for _ in range(min(commit, len(self.pipeline))):
            self.commit()
        self.pipeline.clear()
        self.outbox.clear()
        self.feed.clear()
        mount = self.state.begin_mount()
        for txn in range(self.hwm + 1, len(self.log)):
            self.deliver("feed", self.log[txn], txn)
        assert self.state.on_mount_response(mount, MountResult.READY)
        for token in self.monitor.take_resends(self.now):  # sent again with their sequence numbers
            self.inbox.append(("append", self.req_ids[token]))
        self.record(self.monitor.on_mount_complete())

    def finish(self) -> None:
        while True:
            while self.inbox or self.pipeline or self.outbox or self.feed:
                for action, choice in ((1, 0), (2, 0), (4, 0), (4, 1)):
                    self.step(action, choice)
            self.remount(commit=0)
            if not self.inbox:
                return


# Actions weighted so that a run has several appends in flight between remounts.
ACTIONS = st.sampled_from([0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 4, 4, 4, 5, 6])


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(ACTIONS, st.integers(0, 3)), min_size=20, max_size=150))
def test_outcomes_match_the_log(steps: list[tuple[int, int]]) -> None:
    sim = Simulation()
    for action, choice in steps:
        sim.step(action, choice)
    sim.finish()
    assert sim.monitor.pending_count() == 0
    seqs = [req.seq_num for req in sim.log]
    assert len(seqs) == len(set(seqs)), "an append committed twice"
    committed_at = {req: txn for txn, req in enumerate(sim.log)}
    for token, req in enumerate(sim.req_ids):
        outcomes = sim.outcomes[token]
        *notices, (final, _) = outcomes
        assert final.is_final and all(not o.is_final for o, _ in notices) and len(notices) <= 1
        if req in committed_at:
            assert final == Outcome.committed(committed_at[req])
        else:
            assert final.kind is OutcomeKind.FAILED
        for notice, _ in notices:
            assert notice.transaction_id is not None and outcomes[-1][1] >= notice.transaction_id
