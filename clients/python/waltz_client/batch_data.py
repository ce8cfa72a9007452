"""BatchData: where the transactions of one feed batch get their data, a range at a time.

A fed transaction carries no data (only this client's own appends have theirs at hand): the first
Transaction.data() of another client's transaction fetches it. One GetTransactionData call each costs a
round trip per transaction, which bounds a catch-up at a few hundred transactions a second whatever the
application does; so the first fetch of a batch reads every transaction after it in the batch too (one
ReadTransactions call per READ_CHUNK), and the later data() calls find theirs here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

READ_CHUNK = 1000  # transactions per ReadTransactions call: a feed batch's worth (server.feedBatchSize)

FetchOne = Callable[[int, int], bytes]  # (partition id, transaction id) -> data
FetchRange = Callable[[int, int, int], dict[int, bytes]]  # (partition id, first, last) -> data by transaction id


class BatchData:
    """The data source of one feed batch's transactions (FedTransaction's source); thread-safe.

    last_id: the batch's last transaction that has no data of its own (set once the batch is made).
    A range that cannot be read (a driver without ReadTransactions, a server that failed it) falls
    back to fetch_one, for the rest of the batch."""

    __slots__ = ("_fetch_one", "_fetch_range", "_fetched", "_lock", "last_id")

    def __init__(self, fetch_one: FetchOne, fetch_range: FetchRange | None, last_id: int) -> None:
        self._fetch_one = fetch_one
        self._fetch_range = fetch_range
        self.last_id = last_id
        self._fetched: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, partition_id: int, transaction_id: int) -> bytes:
        with self._lock:
            data = self._fetched.pop(transaction_id, None)
            if data is not None:
                return data
            fetch_range = self._fetch_range
            if fetch_range is not None and transaction_id < self.last_id:
                last = min(self.last_id, transaction_id + READ_CHUNK - 1)
                try:
                    self._fetched.update(fetch_range(partition_id, transaction_id, last))
                except Exception as exc:  # the one-at-a-time fetch below has its own retries and errors
                    log.info("partition %d: reading transactions %d..%d at once failed (%s); fetching them one "
                             "at a time", partition_id, transaction_id, last, exc)
                    self._fetch_range = None
                data = self._fetched.pop(transaction_id, None)
                if data is not None:
                    return data
        return self._fetch_one(partition_id, transaction_id)
