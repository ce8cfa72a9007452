"""What the database helpers (SQLite, PostgreSQL, asyncio PostgreSQL) share when they apply a batch: which of its
transactions are still to apply, and the skeleton of an exactly-once apply (BatchApplyCallbacks)."""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from waltz_client.api import Transaction, WaltzClientCallbacks
from waltz_client.errors import WaltzError

T = TypeVar("T", bound=Transaction)
F = TypeVar("F", bound=Callable[..., Any])
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def helper_default(method: F) -> F:
    """Marks a helper's own apply or apply_batch: a subclass must replace at least one of the two."""
    method.__waltz_helper_default__ = True  # type: ignore[attr-defined]
    return method


def is_helper_default(cls: type, name: str) -> bool:
    """Whether cls keeps the helper's own method of that name (marked helper_default)."""
    return getattr(getattr(cls, name, None), "__waltz_helper_default__", False)


def check_table_name(table: str) -> str:
    """The high-water-mark table's name, if it is a plain SQL name (ValueError otherwise: it goes into SQL)."""
    if not _NAME.match(table):
        raise ValueError(f"not a plain SQL table name: {table!r}")
    return table


def describe_batch(transactions: Sequence[Transaction]) -> str:
    """`applying transaction 7 of partition 0`, `applying transactions 7..12 of partition 0`, for messages."""
    first, last = transactions[0], transactions[-1]
    if first is last:
        return f"applying transaction {first.transaction_id} of partition {first.partition_id}"
    return f"applying transactions {first.transaction_id}..{last.transaction_id} of partition {first.partition_id}"


class BatchApplyCallbacks(WaltzClientCallbacks):
    """The skeleton of the database helpers: each batch the feed brings (apply_transactions; apply_transaction is
    a batch of one) is applied in ONE database transaction that locks the partition's row of the high-water-mark
    table, skips the transactions up to the stored mark (another instance applied them: `skipped` counts them),
    applies the rest with apply_batch (by default apply() for each) and moves the mark to the batch's last id.

    A subclass of a helper implements apply (one transaction) or apply_batch (a batch at once: executemany, COPY),
    or both; instantiating one that implements neither is a TypeError. A helper implements
    _apply_in_one_transaction, its database's way of doing the above."""

    skipped: int = 0  # transactions another instance had applied already

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if is_helper_default(cls, "apply") and is_helper_default(cls, "apply_batch"):
            raise TypeError(f"Can't instantiate {cls.__name__}: implement apply() (one transaction) or "
                            "apply_batch() (a batch at once), or both")
        return super().__new__(cls)

    def apply_transaction(self, transaction: Transaction) -> None:
        # straight to the database, not through apply_transactions: a subclass may make that the client's
        # per-transaction default (which calls this), and the two would call each other for ever
        self.skipped += self._apply_in_one_transaction([transaction], describe_batch([transaction]))

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        """Apply a batch in ONE database transaction with one high-water-mark update: all of it or none."""
        if transactions:
            self.skipped += self._apply_in_one_transaction(transactions, describe_batch(transactions))

    @abstractmethod
    def _apply_in_one_transaction(self, transactions: list[Transaction], what: str) -> int:
        """Apply what the database has not yet, with the mark, in one database transaction (what: for messages);
        how many of them it had already."""
