"""FeedIntake: a feed batch's inline data (issue 31) is used when its checksum holds, and fetched when it does not
or when the entry carries none."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from waltz.v1 import server_pb2
from waltz_client import feed_intake
from waltz_client.api import FedTransaction
from waltz_client.feed_intake import FeedIntake
from waltz_client.metrics import LatencyHistogram
from waltz_client.monitor import TransactionMonitor
from waltz_client.partition_env import PartitionEnv, Stats
from waltz_common.types import crc32


def entry(transaction_id: int, data: bytes | None, checksum: int | None = None) -> server_pb2.FeedData:
    fed = server_pb2.FeedData(transaction_id=transaction_id, header=0)
    fed.req_id.client_id, fed.req_id.seq_num = 2, transaction_id  # another client's
    if data is not None:
        fed.has_data, fed.data = True, data
        fed.checksum = crc32(data) if checksum is None else checksum
    return fed


def test_inline_data_is_used_when_its_checksum_holds_and_fetched_otherwise() -> None:
    fetched: list[int] = []

    def fetch(partition_id: int, transaction_id: int) -> bytes:
        fetched.append(transaction_id)
        return b"fetched %d" % transaction_id

    env: Any = SimpleNamespace(client_id=1, stats=Stats(), fetch=fetch, fetch_range=None, latency=None)
    intake = FeedIntake(0, cast(PartitionEnv, env), TransactionMonitor())
    entries = [entry(0, b"inline"), entry(1, b"damaged", checksum=crc32(b"damaged") ^ 1), entry(2, None),
               entry(3, b"")]
    steps, superseded, gap_at, foreign, last_foreign = intake.steps(entries, 0)
    transactions = [cast(FedTransaction, t) for _, _, t in steps]
    assert [t.loaded for t in transactions] == [True, False, False, True]
    assert [t.data() for t in transactions] == [b"inline", b"fetched 1", b"fetched 2", b""]
    assert fetched == [1, 2] and last_foreign == 2 and (superseded, gap_at, foreign) == ([], None, 0)
    assert env.stats.inline_data == 2 and env.stats.fetched == 2



def test_the_commit_latency_of_own_appends_is_observed_once_per_run_sent_together_as_it_was_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feed_intake.time, "monotonic", lambda: 2.0)  # the intake's clock, read once per batch
    rng = random.Random(3)
    for _ in range(50):
        sent = sorted(rng.choice([1.0, 1.9995, 1.997, 1.8]) for _ in range(rng.randint(1, 30)))  # AppendBatches
        monitor: TransactionMonitor[Any] = TransactionMonitor(100)
        tokens = [SimpleNamespace(client_id=1, generation=1, partition_id=0, seq_num=seq, sent_at=at, data=b"x")
                  for seq, at in enumerate(sent)]
        monitor.register_all(tokens, 0.0)
        histogram = LatencyHistogram()
        env: Any = SimpleNamespace(client_id=1, stats=Stats(), fetch=None, fetch_range=None, latency=histogram)
        entries = []
        for token in tokens:
            fed = server_pb2.FeedData(transaction_id=token.seq_num)
            fed.req_id.client_id, fed.req_id.generation, fed.req_id.seq_num = 1, 1, token.seq_num
            entries.append(fed)
        steps = FeedIntake(0, cast(PartitionEnv, env), monitor).steps(entries, 0)[0]
        assert [mine for _, mine, _ in steps] == tokens  # every one committed, in order
        one_by_one = LatencyHistogram()
        for token in tokens:
            one_by_one.observe(2.0 - token.sent_at)
        assert histogram.counts == one_by_one.counts
        assert histogram.total == pytest.approx(one_by_one.total)
