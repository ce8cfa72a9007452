"""FeedIntake: a feed batch's inline data (issue 31) is used when its checksum holds, and fetched when it does not
or when the entry carries none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from waltz.v1 import server_pb2
from waltz_client.api import FedTransaction
from waltz_client.feed_intake import FeedIntake
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
