"""The feed's plain path (plain_transactions, FeedSteps.run_plain*, ClientPartition's catch-up case) keeps the feed's
guarantees: id order, each transaction applied once, the apply retried, a gap remounted, this client's appends settled
by the general steps."""

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from waltz.v1 import common_pb2, server_pb2
from waltz_client.api import PartialApplyError, Transaction, TransactionContext, WaltzClientCallbacks
from waltz_client.config import ClientConfig
from waltz_client.feed_steps import FeedSteps, plain_transactions
from waltz_client.partition import ClientPartition, _Verdict
from waltz_client.partition_env import PartitionEnv, PendingAppend
from waltz_client.tasks import LoopCallbacks
from waltz_common.topology import Ownership
from waltz_common.types import ReqId, crc32

ME, OTHER = 1, 2


def entry(txn_id: int, client_id: int = OTHER, partition_id: int = 0, seq_num: int | None = None) -> Any:
    req_id = common_pb2.ReqId(client_id=client_id, generation=1, partition_id=partition_id,
                              seq_num=txn_id if seq_num is None else seq_num)
    return server_pb2.FeedData(req_id=req_id, transaction_id=txn_id, header=txn_id % 7)


def no_data(partition_id: int, transaction_id: int) -> bytes:
    raise AssertionError("no data is read here")


class Applying(WaltzClientCallbacks):
    """Applies into a list; raises once for each id in fail_once."""

    def __init__(self, fail_once: set[int] | None = None) -> None:
        self.applied: list[int] = []
        self.fail_once = set(fail_once or ())

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction: Transaction) -> None:
        if transaction.transaction_id in self.fail_once:
            self.fail_once.discard(transaction.transaction_id)
            raise RuntimeError(f"apply {transaction.transaction_id} fails once")
        self.applied.append(transaction.transaction_id)


class BatchApplying(Applying):
    def apply_transactions(self, transactions: list[Transaction]) -> None:
        for i, transaction in enumerate(transactions):
            try:
                self.apply_transaction(transaction)
            except RuntimeError as exc:
                raise PartialApplyError(i, exc) from exc


def test_plain_transactions_stop_at_the_first_entry_that_needs_a_step_of_its_own() -> None:
    def ids(entries: list[Any]) -> list[int]:
        return [t.transaction_id for t in plain_transactions(entries, 0, 0, ME, no_data)]

    assert ids([entry(0), entry(1), entry(2)]) == [0, 1, 2]
    assert ids([entry(0), entry(1, client_id=ME), entry(2)]) == [0]  # this client's: the monitor decides
    assert ids([entry(0), entry(1, partition_id=3), entry(2)]) == [0]  # another partition's: ignored and logged
    assert ids([entry(0), entry(2)]) == [0]  # a gap
    assert ids([entry(0), entry(0), entry(1)]) == [0]  # fed again
    assert ids([entry(1)]) == []  # not the next one
    made = plain_transactions([entry(5)], 5, 0, ME, no_data)[0]
    assert (made.partition_id, made.transaction_id, made.header, made.req_id.client_id) == (0, 5, 5, OTHER)


def test_a_plain_transaction_reads_its_req_id_from_its_entry_after_the_message_is_gone() -> None:
    def transactions() -> list[Transaction]:
        raw = feed([entry(i, seq_num=40 + i) for i in range(3)]).SerializeToString()
        message = server_pb2.ServerMessage.FromString(raw)
        return plain_transactions(message.feed.transactions, 0, 0, ME, no_data)

    made = transactions()
    gc.collect()
    assert [t.req_id for t in made] == [ReqId(OTHER, 1, 0, 40 + i) for i in range(3)]
    assert made[1].req_id is made[1].req_id  # converted once


def test_run_plain_stops_at_a_raise_and_goes_on_from_there() -> None:
    callbacks = Applying({3})
    steps = FeedSteps(0, callbacks)
    transactions = plain_transactions([entry(i) for i in range(6)], 0, 0, ME, no_data)
    assert steps.run_plain(transactions, 0, 0)[:2] == (3, 3) and steps.applied == 2
    assert steps.run_plain(transactions, 3, 3) == (6, 6, None) and steps.applied == 5
    assert callbacks.applied == [0, 1, 2, 3, 4, 5]
    assert FeedSteps(0, Applying({0})).run_plain(transactions, 0, 0)[:2] == (0, 0)


def test_run_plain_batch_counts_a_partial_apply() -> None:
    callbacks = BatchApplying({4})
    steps = FeedSteps(0, callbacks)
    transactions = plain_transactions([entry(i) for i in range(6)], 0, 0, ME, no_data)
    reached, _, error = steps.run_plain_batch(transactions, 0, 0)
    assert (reached, steps.applied, type(error)) == (4, 3, RuntimeError)
    assert steps.run_plain_batch(transactions, 4, 4) == (6, 6, None) and callbacks.applied == list(range(6))


def partition(callbacks: WaltzClientCallbacks, runner: LoopCallbacks) -> ClientPartition:
    owner = Ownership("test:1", 1)
    topology = asyncio.Event()
    env = PartitionEnv(client_id=ME, config=ClientConfig.of({"client.servers": ["test:1"]}, zookeeper_required=False),
                       callbacks=callbacks, call=runner.call, call_first=runner.call_first, post=runner.post,
                       connections=None,  # type: ignore[arg-type]
                       ownership=lambda pid: owner, topology_changed=lambda: topology, fetch=no_data)
    made = ClientPartition(0, env)
    made.conn = SimpleNamespace(closed=False, endpoint="test:1", seq_num=0, enqueue=lambda message: None)  # type: ignore[assignment]
    return made


def feed(entries: list[Any]) -> server_pb2.ServerMessage:
    return server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=entries))


class Ctx(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: Any) -> bool:
        return True


class Mine(PendingAppend):
    def __init__(self) -> None:
        super().__init__(Ctx())
        self.commits: list[int] = []

    def commit(self, transaction_id: int) -> None:
        self.commits.append(transaction_id)


def test_a_catch_up_batch_is_applied_in_order_once_each_with_the_apply_retried() -> None:
    async def main() -> None:
        for callbacks in (Applying({3, 7}), BatchApplying({3, 7})):
            runner = LoopCallbacks()
            p = partition(callbacks, runner)
            p._report = _no_report  # type: ignore[method-assign]
            assert await p._on_feed(feed([entry(i) for i in range(10)]).feed.transactions) is None
            assert callbacks.applied == list(range(10)) and p.client_high_water_mark == 9
            assert p.env.stats.applied == 10 and p.apply_failure is None
            runner.shutdown()

    asyncio.run(_quick_retries(main))


def test_a_gap_after_plain_entries_applies_those_and_remounts() -> None:
    async def main() -> None:
        callbacks = Applying()
        p = partition(callbacks, LoopCallbacks())
        p.state.begin_mount()
        assert await p._on_feed(feed([entry(0), entry(1), entry(3)]).feed.transactions) is _Verdict.REMOUNT
        assert callbacks.applied == [0, 1] and p.client_high_water_mark == 1

    asyncio.run(main())


def test_this_clients_append_after_plain_entries_is_settled_once_by_the_general_steps() -> None:
    async def main() -> None:
        callbacks = Applying()
        p = partition(callbacks, LoopCallbacks())
        mine = Mine()
        mine.client_id, mine.generation, mine.partition_id, mine.seq_num, mine.data = ME, 1, 0, 0, b"mine"
        p.monitor.register_all([mine], 0.0)
        entries = [entry(0), entry(1), entry(2, client_id=ME, seq_num=0), entry(3)]
        assert await p._on_feed(feed(entries).feed.transactions) is None
        assert callbacks.applied == [0, 1, 2, 3] and mine.commits == [2] and p.monitor.pending_count() == 0
        assert p.env.stats.committed == 1 and p.env.stats.applied == 4

    asyncio.run(main())


async def _no_report(txn_id: int, exc: BaseException) -> None:
    pass


async def _quick_retries(main: Any) -> None:
    """main() with the apply retry's sleep cut short."""
    sleep = asyncio.sleep

    async def short(delay: float, *args: Any) -> Any:
        return await sleep(0, *args)

    asyncio.sleep = short  # type: ignore[assignment]
    try:
        await main()
    finally:
        asyncio.sleep = sleep


# A feed batch as a server could send it: (kind, id offset) per entry. Kinds: another client's append, one of this
# client's (pending or not), another partition's, and another client's with inline data (its checksum holding or
# not); the offset moves the id off the next one (0: in order; else a gap, or an entry fed again).
ENTRY_KINDS = ("other", "mine", "mine", "foreign", "inline", "damaged")
BATCHES = st.lists(st.lists(st.tuples(st.sampled_from(ENTRY_KINDS), st.sampled_from((0, 0, 0, 0, 1, -1))),
                            min_size=1, max_size=12), min_size=1, max_size=4)


def _data(txn_id: int) -> bytes:
    return b"data %d" % txn_id


def _feed_batch(spec: list[tuple[str, int]], first: int, mine_seqs: list[int]) -> list[Any]:
    entries, txn_id = [], first
    for kind, offset in spec:
        txn_id = max(0, txn_id + offset)
        if kind == "mine":
            made = entry(txn_id, client_id=ME, seq_num=mine_seqs.pop(0) if mine_seqs else 1000 + txn_id)
        else:
            made = entry(txn_id, partition_id=5 if kind == "foreign" else 0)
            if kind in ("inline", "damaged"):
                data = _data(txn_id)
                made.has_data, made.data = True, data if kind == "inline" else b"damaged"
                made.checksum = crc32(data)
        entries.append(made)
        txn_id += 1
    return entries


class _Reading(Applying):
    def apply_transaction(self, transaction: Transaction) -> None:
        super().apply_transaction(transaction)
        self.read = getattr(self, "read", [])
        self.read.append((transaction.transaction_id, transaction.req_id, transaction.header, transaction.data()))


@settings(max_examples=150, deadline=None)
@given(batches=BATCHES, pending=st.integers(0, 4), inline_asked=st.booleans())
def test_the_plain_path_applies_and_settles_exactly_what_the_general_steps_alone_do(
        batches: list[list[tuple[str, int]]], pending: int, inline_asked: bool) -> None:
    """Each feed batch through _on_feed as it is (the plain path first) and with the plain path switched off (every
    entry through FeedIntake.steps, the feed's original path): the same transactions applied, in the same order, with
    the same ids, ReqIds, headers and data; the same appends committed with the same ids; the same high-water mark
    and the same verdicts (a gap remounts)."""

    def run(plain: bool) -> tuple[Any, ...]:
        async def main() -> tuple[Any, ...]:
            callbacks = _Reading()
            p = partition(callbacks, LoopCallbacks())
            p.env.fetch = lambda partition_id, transaction_id: _data(transaction_id)  # type: ignore[misc]
            p._inline_asked = 4096 if inline_asked else 0
            if not plain:
                p._intake.plain = lambda entries, next_id, inline=True: ([], None)  # type: ignore[method-assign]
            tokens = []
            for seq in range(pending):
                mine = Mine()
                mine.client_id, mine.generation, mine.partition_id, mine.seq_num = ME, 1, 0, seq
                mine.data = _data(seq)
                tokens.append(mine)
            p.monitor.register_all(tokens, 0.0)
            verdicts, seqs = [], list(range(pending))
            for spec in batches:
                entries = feed(_feed_batch(spec, p.client_high_water_mark + 1, seqs)).feed.transactions
                verdicts.append(await p._on_feed(entries))
            return (getattr(callbacks, "read", []), [t.commits for t in tokens], p.client_high_water_mark,
                    verdicts, p.env.stats.applied, p.env.stats.committed, p.monitor.pending_count())

        return asyncio.run(main())

    assert run(plain=True) == run(plain=False)
