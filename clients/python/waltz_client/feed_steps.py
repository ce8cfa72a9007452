"""The application's side of a partition's feed batch, run on the client's callback thread: each step's context
hooks and the transaction's apply, one at a time or as one apply_transactions call (ClientPartition settles them)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from waltz_client.api import EntryTransaction, PartialApplyError, Transaction, WaltzClientCallbacks
from waltz_client.partition_env import PendingAppend

log = logging.getLogger("waltz_client.partition")  # the partition's log, as before the split

FeedStep = tuple[int, PendingAppend | None, Transaction | None]
"""The application's side of one fed transaction: its id, this client's append it commits (if any),
the transaction to apply (None: applied already, fed again after a reconnect). A tuple: one per append."""


def plain_transactions(entries: Sequence[Any], next_id: int, partition_id: int, client_id: int | None,
                       source: Callable[[int, int], bytes], inline: bool = True) -> list[Transaction]:
    """The leading entries of a feed batch (protobuf FeedData) that need no step of their own, as the transactions
    to apply: the next ones in id order from next_id, of this partition, appended by another client (no pending
    append of this client can be among them). It stops at the first entry that is not one (that entry and the
    rest take the general steps; so does an entry with inline data, whose checksum they check). The catch-up case,
    where every entry is one: no tuple, no monitor lookup.

    client_id None: none of this client's appends is pending, so its entries need no step either (the general
    steps would find nothing to resolve). inline False: the feed was not asked for inline data, so an entry's
    has_data is not read (were it set, the data is fetched as without it). Each is a field read fewer per entry."""
    transactions: list[Transaction] = []
    append = transactions.append
    for index, entry in enumerate(entries):
        req_id = entry.req_id
        if (req_id.partition_id != partition_id or entry.transaction_id != next_id
                or (client_id is not None and req_id.client_id == client_id)
                or (inline and entry.has_data)):  # inline data: the general steps check its checksum
            break
        append(EntryTransaction(partition_id, next_id, entries, index, entry.header, source))
        next_id += 1
    return transactions



class FeedSteps:
    """Runs feed steps for one partition's application callbacks; returns where it stopped, raises nothing."""

    def __init__(self, partition_id: int, callbacks: WaltzClientCallbacks) -> None:
        self.partition_id = partition_id
        self.callbacks = callbacks
        self.applied = -1  # the last transaction id an apply returned for (written on the callback thread)

    def run_steps(self, steps: list[FeedStep], index: int, completed: int) -> tuple[int, int, BaseException | None]:
        """On the callback thread, from steps[index] (those before steps[completed] had their on_completion):
        on_completion, apply_transaction, on_application, in feed order. Stops at an apply that raises:
        (its index, the steps whose on_completion ran, the error). Every hook is called, TransactionContext's
        empty ones too: a call costs less than telling them apart."""
        apply = self.callbacks.apply_transaction
        for i in range(index, len(steps)):
            txn_id, mine, transaction = steps[i]
            if mine is not None and i >= completed:
                try:
                    mine.context.on_completion(True)
                except Exception as exc:
                    self.hook_raised("on_completion", txn_id, exc)
            if transaction is not None:
                try:
                    apply(transaction)
                except Exception as exc:
                    return i, i + 1, exc
                self.applied = txn_id
            if mine is not None:
                try:
                    mine.context.on_application()
                except Exception as exc:
                    self.hook_raised("on_application", txn_id, exc)
        return len(steps), len(steps), None

    def run_plain(self, transactions: list[Transaction], index: int,
                  completed: int) -> tuple[int, int, BaseException | None]:
        """run_steps for transactions alone (plain_transactions: no hooks, consecutive ids): apply_transaction for each
        from transactions[index]; stops at one that raises: (its index, its index, the error)."""
        apply = self.callbacks.apply_transaction
        transaction = None
        try:
            for transaction in transactions[index:] if index else transactions:
                apply(transaction)
        except Exception as exc:
            assert transaction is not None
            failed = index + transaction.transaction_id - transactions[index].transaction_id  # the ids are consecutive
            if failed > index:
                self.applied = transaction.transaction_id - 1
            return failed, failed, exc
        if transaction is not None:
            self.applied = transaction.transaction_id
        return len(transactions), len(transactions), None

    def run_plain_batch(self, transactions: list[Transaction], index: int,
                        completed: int) -> tuple[int, int, BaseException | None]:
        """run_batch for transactions alone: one apply_transactions of transactions[index:]; a raise applied none
        of them (PartialApplyError: its first `applied`): (the index of the first not applied, it, the error)."""
        batch = transactions[index:] if index else transactions
        if not batch:
            return index, index, None
        applied, error = self._apply_all(batch)
        reached = index + applied
        if reached > index:
            self.applied = transactions[reached - 1].transaction_id
        return reached, reached, error

    def run_batch(self, steps: list[FeedStep], index: int, completed: int) -> tuple[int, int, BaseException | None]:
        """run_steps for callbacks that override apply_transactions: every on_completion of steps[index:], one
        apply_transactions of their transactions, the on_application of those it applied. A raise applied none
        of them (PartialApplyError: its first `applied`): (the step of the first not applied, len(steps), error)."""
        for i in range(max(index, completed), len(steps)):
            txn_id, mine, _ = steps[i]
            if mine is not None:
                try:
                    mine.context.on_completion(True)
                except Exception as exc:
                    self.hook_raised("on_completion", txn_id, exc)
        transactions = [transaction for _, _, transaction in steps[index:] if transaction is not None]
        reached, error = len(steps), None
        if transactions:
            done, error = self._apply_all(transactions)
            if error is not None:
                reached = self._step_of(steps, index, transactions, done)
        applied = [transaction.transaction_id for _, _, transaction in steps[index:reached] if transaction is not None]
        if applied:
            self.applied = applied[-1]
        for i in range(index, reached):
            txn_id, mine, _ = steps[i]
            if mine is not None:
                try:
                    mine.context.on_application()
                except Exception as exc:
                    self.hook_raised("on_application", txn_id, exc)
        return reached, len(steps), error

    def _apply_all(self, transactions: list[Transaction]) -> tuple[int, BaseException | None]:
        """One apply_transactions call: (how many it applied, what stopped it: None when it applied them all)."""
        try:
            self.callbacks.apply_transactions(transactions)
        except PartialApplyError as exc:
            if exc.applied >= len(transactions):  # applied them all, then failed: nothing to apply again
                self.hook_raised("apply_transactions", transactions[-1].transaction_id, exc.error)
                return len(transactions), None
            return max(0, exc.applied), exc.error
        except Exception as exc:
            return 0, exc
        return len(transactions), None

    @staticmethod
    def _step_of(steps: list[FeedStep], index: int, transactions: list[Transaction], applied: int) -> int:
        """The index in steps of transactions[applied], the first one a failed batch did not apply."""
        failed = transactions[max(0, applied)].transaction_id
        return next(i for i in range(index, len(steps)) if steps[i][0] == failed and steps[i][2] is not None)

    def run_hook(self, hook: Callable[[], None], name: str, txn_id: int) -> None:
        """On the callback thread: a context hook the loop does not wait for (on_lock_failure)."""
        try:
            hook()
        except Exception as exc:
            self.hook_raised(name, txn_id, exc)

    def hook_raised(self, hook: str, txn_id: int, exc: BaseException) -> None:
        """A context hook raised, on the callback thread: it goes to uncaught_exception."""
        log.error("partition %d: context hook %s raised", self.partition_id, hook, exc_info=exc)
        try:
            self.callbacks.uncaught_exception(self.partition_id, txn_id, exc)
        except Exception:
            log.exception("uncaught_exception callback raised")
