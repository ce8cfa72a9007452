"""The decision the database helpers share when they apply a batch: which of its transactions are still to apply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from waltz_client.api import Transaction
from waltz_client.errors import WaltzError

T = TypeVar("T", bound=Transaction)


def still_to_apply(transactions: Sequence[T], stored_high_water_mark: int) -> Sequence[T]:
    """The transactions after the database's high-water mark (those up to it another instance applied), checked
    to follow it without a gap; transactions must be consecutive ids of one partition (WaltzError otherwise)."""
    if not transactions:
        return transactions
    first, last = transactions[0].transaction_id, transactions[-1].transaction_id
    pid = transactions[0].partition_id
    if last - first != len(transactions) - 1:
        raise WaltzError(f"partition {pid}: a batch must hold consecutive transactions, "
                         f"not {len(transactions)} from {first} to {last}")
    if stored_high_water_mark >= last:
        return transactions[:0]
    if stored_high_water_mark < first - 1:
        raise WaltzError(f"partition {pid}: the database's high-water mark is {stored_high_water_mark}, "
                         f"cannot apply transaction {first}")
    return transactions[stored_high_water_mark + 1 - first:]
