"""A feed batch's own appends end in one call (_Submission.commit_all, issue 34) instead of one commit() each: the
same futures end, the pending count and the drained event move the same way, and the own locks go on (issue 31) to
the same parked appends in the same order; OwnLocks.idle() is the shortcut that lets appends without locks skip
the own-lock bookkeeping, so it must be true exactly when no token holds or waits for a lock."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from waltz_client.api import TransactionContext
from waltz_client.own_locks import OwnLocks
from waltz_client.partition_env import PendingAppend, Stats
from waltz_client.submission import Submitter, _Submission
from waltz_client.tasks import Job, TaskSet


class Ctx(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: Any) -> bool:
        return True


class Recorder:
    """The callback thread as the submissions see it: what they schedule (a resumed append executing again)."""

    def __init__(self) -> None:
        self.scheduled: list[Job] = []

    def schedule(self, job: Job) -> None:
        self.scheduled.append(job)


class Partition:
    partition_id = 0

    def __init__(self) -> None:
        self.own_locks: OwnLocks[PendingAppend] = OwnLocks()


def world(seed: int) -> tuple[Submitter, Recorder, Partition, list[_Submission]]:
    """A partition with 12 sent submissions: some hold locks, some are parked behind them, some futures cancelled."""
    rng = random.Random(seed)
    recorder = Recorder()
    submitter = Submitter(recorder, TaskSet(), Stats(), -1)  # type: ignore[arg-type]  # schedule() is all it uses
    loop = asyncio.get_running_loop()
    submitter.bind(loop)
    partition = Partition()
    submissions = []
    for _ in range(12):
        future: asyncio.Future[bool] = loop.create_future()
        submissions.append(_Submission(submitter, Ctx(), partition, future))  # type: ignore[arg-type]
        submitter.pending += 1
    for submission in submissions:
        if rng.random() < 0.5:
            partition.own_locks.admit(submission, rng.sample(range(4), rng.randint(0, 2)), rng.sample(range(4), 1))
        if rng.random() < 0.2:
            submission.future.cancel()
    return submitter, recorder, partition, submissions


def outcome(submitter: Submitter, recorder: Recorder, partition: Partition, submissions: list[_Submission]) -> Any:
    locks = partition.own_locks
    locks.check()
    index = {id(s): i for i, s in enumerate(submissions)}
    return (submitter.pending, submitter._drained.is_set(),
            [(s.future.cancelled(), s.future.done() and not s.future.cancelled() and s.future.result())
             for s in submissions],
            [index[id(job)] for job in recorder.scheduled],
            sorted((lock, index[id(t)]) for lock, t in locks._holders.items()),
            sorted((index[id(t)], lock) for t, lock in locks._parked_on.items()),
            locks.idle())


def test_commit_all_ends_the_same_appends_and_hands_on_the_same_locks_as_commit_one_by_one() -> None:
    async def main() -> None:
        for seed in range(300):
            rng = random.Random(seed)
            ended = sorted(rng.sample(range(12), rng.randint(1, 12)))
            if rng.random() < 0.3:
                ended = list(range(12))  # every pending append: the drained event is set
            results = []
            for batch in (False, True):
                submitter, recorder, partition, submissions = world(seed)
                tokens = [submissions[i] for i in ended if partition.own_locks.parked_on(submissions[i]) is None]
                if not tokens:
                    break
                if batch:
                    _Submission.commit_all(tokens, list(range(len(tokens))))
                else:
                    for txn_id, token in enumerate(tokens):
                        token.commit(txn_id)
                results.append(outcome(submitter, recorder, partition, submissions))
            if len(results) == 2:
                assert results[0] == results[1], f"seed {seed}"

    asyncio.run(main())


def test_idle_is_true_exactly_when_no_token_holds_or_waits_for_a_lock() -> None:
    rng = random.Random(7)
    own: OwnLocks[int] = OwnLocks()
    tokens = list(range(8))
    for _ in range(3000):
        token = rng.choice(tokens)
        if own.parked_on(token) is None and rng.random() < 0.6:
            own.admit(token, rng.sample(range(3), rng.randint(0, 1)), rng.sample(range(3), rng.randint(0, 1)))
        else:
            own.release(token)
        assert own.idle() == (not any(own.holds(t) or own.parked_on(t) is not None for t in tokens))
        if own.idle():  # then a token without locks is admitted without any change, and a release changes nothing
            assert own.admit(token, [], []) == (True, []) and own.release(token) == [] and own.idle()
