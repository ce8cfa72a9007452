"""What applications implement and touch: contexts, builders, callbacks, transactions, serializers."""

from __future__ import annotations

import json
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, overload

from waltz_client.locks import PartitionLocalLock, lock_hashes
from waltz_client.monitor import ReqIdFields
from waltz_common.types import INT32_MAX, INT32_MIN, ReqId, crc32

T = TypeVar("T")


class Serializer(Protocol[T]):
    """Turns application objects into transaction data and back."""

    def serialize(self, value: T) -> bytes: ...

    def deserialize(self, data: bytes) -> T: ...


class JsonSerializer:
    """JSON (UTF-8) serializer for plain dicts, lists, strings and numbers."""

    def serialize(self, value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def deserialize(self, data: bytes) -> Any:
        return json.loads(data.decode("utf-8"))


class _LockHashes:
    """A builder's list of lock hashes, made on first use: most appends take no locks, and each
    list made for nothing is one more object for the garbage collector to count."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = "_" + name

    def __get__(self, builder: Any, owner: type | None = None) -> list[int]:
        if builder is None:
            return self  # type: ignore[return-value]  # the class attribute itself
        hashes: list[int] | None = getattr(builder, self._slot)
        if hashes is None:
            hashes = []
            setattr(builder, self._slot, hashes)
        return hashes

    def __set__(self, builder: Any, hashes: list[int]) -> None:
        setattr(builder, self._slot, hashes)


class TransactionBuilder:
    """Filled in by TransactionContext.execute: header, data and locks of one append."""

    write_locks = _LockHashes()
    read_locks = _LockHashes()
    append_locks = _LockHashes()
    # defaults on the class: a builder is made per append, and most set only the data
    header = 0
    data = b""
    _write_locks: list[int] | None = None
    _read_locks: list[int] | None = None
    _append_locks: list[int] | None = None

    def __init__(self, partition_id: int, client_high_water_mark: int) -> None:
        self.partition_id = partition_id
        self.client_high_water_mark = client_high_water_mark

    def takes_locks(self) -> bool:
        """Whether any lock list is non-empty (without making the lists)."""
        return bool(self._write_locks or self._read_locks or self._append_locks)

    def set_header(self, header: int) -> None:
        if not INT32_MIN <= header <= INT32_MAX:
            raise ValueError(f"header {header} is outside the signed 32-bit range")
        self.header = header

    def set_data(self, data: Any, serializer: Serializer[Any] | None = None) -> None:
        """Raw bytes, or any value together with the serializer that turns it into bytes."""
        if type(data) is bytes and serializer is None:  # the common case, checked the cheap way
            self.data = data
            return
        raw = serializer.serialize(data) if serializer is not None else data
        if not isinstance(raw, bytes | bytearray | memoryview):
            raise TypeError("transaction data must be bytes (or pass a serializer)")
        self.data = bytes(raw)

    def set_write_locks(self, locks: Sequence[PartitionLocalLock]) -> None:
        """Checked against and recorded in the partition's lock table."""
        self.write_locks = lock_hashes(locks)

    def set_read_locks(self, locks: Sequence[PartitionLocalLock]) -> None:
        """Checked only."""
        self.read_locks = lock_hashes(locks)

    def set_append_locks(self, locks: Sequence[PartitionLocalLock]) -> None:
        """Recorded only (hierarchical ownership: new owners see in-flight children)."""
        self.append_locks = lock_hashes(locks)

    @property
    def checksum(self) -> int:
        return crc32(self.data)


class TransactionContext(ABC):
    """One logical transaction: picks its partition, builds the append, hears how it ended.

    Exactly one of these ends every submission: committed (on_completion(True), then the
    transaction is applied, then on_application()); declined (execute returned False:
    on_completion(False)); or an error (on_exception(exc)). on_lock_failure() may come before,
    once per lock failure; the client then re-runs execute once it has caught up. All hooks
    run on the client's callback thread (or its event loop: client.callbackThread), in feed
    order with apply_transaction.

    committed_transaction_id: the id of the transaction this context committed as, set by the client before its
    future ends True (None until then; a context submitted again has its latest commit's id), for
    AsyncWaltzClient.wait_applied in another instance (read-your-writes).
    """

    committed_transaction_id: int | None = None

    @abstractmethod
    def partition_id(self, num_partitions: int) -> int:
        """The partition (0 <= id < num_partitions) this transaction goes to."""

    @abstractmethod
    def execute(self, builder: TransactionBuilder) -> bool:
        """Build the transaction from the application's state; False abandons it."""

    def on_completion(self, committed: bool) -> None:  # noqa: B027 - optional hook
        """Committed (before it is applied), or declined by execute."""

    def on_application(self) -> None:  # noqa: B027 - optional hook
        """This client's own transaction has been applied by apply_transaction."""

    def on_exception(self, exc: BaseException) -> None:  # noqa: B027 - optional hook
        """execute raised, or the transaction could not be submitted (timeout, closed, ...)."""

    def on_lock_failure(self) -> None:  # noqa: B027 - optional hook
        """A lock conflicted; execute runs again once the client has caught up."""


class Transaction:
    """A committed transaction in the feed; its data is fetched lazily on first use."""

    _lock: threading.Lock | None = None  # made by the first data() that has to fetch

    def __init__(
        self, partition_id: int, transaction_id: int, req_id: ReqId, header: int,
        fetch: Callable[[], bytes], data: bytes | None = None,
    ) -> None:
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self._req_id: ReqIdFields = req_id
        self.header = header
        self._fetch = fetch
        self._data = data

    @property
    def req_id(self) -> ReqId:
        """The ReqId of the append that created the transaction."""
        r = self._req_id
        if type(r) is not ReqId and r is not None:  # the feed's protobuf ReqId: converted on first use
            r = self._req_id = ReqId(r.client_id, r.generation, r.partition_id, r.seq_num)
        return r

    @req_id.setter
    def req_id(self, req_id: ReqId) -> None:
        self._req_id = req_id

    @overload
    def data(self) -> bytes: ...

    @overload
    def data(self, serializer: Serializer[T]) -> T: ...

    def data(self, serializer: Serializer[Any] | None = None) -> Any:
        """The transaction data (fetched once, checksum verified), deserialized if asked."""
        raw = self._data
        if raw is None:
            with _LOCK_GUARD:
                lock = self._lock
                if lock is None:
                    lock = self._lock = threading.Lock()
            with lock:
                if self._data is None:
                    self._data = self._load()
                raw = self._data
        return serializer.deserialize(raw) if serializer is not None else raw

    def _load(self) -> bytes:
        return self._fetch()

    def __repr__(self) -> str:
        return f"Transaction(partition={self.partition_id}, id={self.transaction_id}, header={self.header})"


_LOCK_GUARD = threading.Lock()  # makes a transaction's lock: most transactions never need one


class FedTransaction(Transaction):
    """A transaction as the client makes one per feed entry: its req_id may be the feed's protobuf ReqId,
    and its data comes from source(partition_id, transaction_id) (one per client, not one per transaction)."""

    def __init__(self, partition_id: int, transaction_id: int, req_id: ReqIdFields, header: int,
                 source: Callable[[int, int], bytes], data: bytes | None) -> None:
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self._req_id = req_id
        self.header = header
        self._source = source
        self._data = data

    def _load(self) -> bytes:
        return self._source(self.partition_id, self.transaction_id)

    @property
    def loaded(self) -> bool:
        """Whether its data is at hand (its own append's, inline in the feed, or read ahead)."""
        return self._data is not None

    def preload(self, data: bytes | None) -> None:
        """Its data, read ahead of the apply (None: data() fetches it)."""
        if data is not None and self._data is None:
            self._data = data


class EntryTransaction(FedTransaction):
    """A FedTransaction of another client's append, made from entries[index], its feed entry (a protobuf FeedData): the
    entry's ReqId is read from it when asked for, so that no ReqId is kept per transaction (an object fewer for the
    garbage collector to visit, per transaction the application keeps)."""

    _req_id = None  # type: ignore[assignment]  # read from the entry on first use
    _data = None

    def __init__(self, partition_id: int, transaction_id: int, entries: Sequence[Any], index: int, header: int,
                 source: Callable[[int, int], bytes]) -> None:
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self._entries = entries
        self._index = index
        self.header = header
        self._source = source

    @property
    def req_id(self) -> ReqId:
        r = self._req_id
        if r is None:
            fed = self._entries[self._index].req_id
            r = self._req_id = ReqId(fed.client_id, fed.generation, fed.partition_id, fed.seq_num)
        return r

    @req_id.setter
    def req_id(self, req_id: ReqId) -> None:
        self._req_id = req_id


class PartialApplyError(Exception):
    """apply_transactions applied the first `applied` transactions of its batch, then `error` stopped it:
    the client counts those as applied and retries from the next one (reporting error)."""

    def __init__(self, applied: int, error: BaseException) -> None:
        super().__init__(f"applied {applied} transactions of the batch, then: {type(error).__name__}: {error}")
        self.applied = applied
        self.error = error


def applies_batches(callbacks: WaltzClientCallbacks) -> bool:
    """Whether the application's callbacks override apply_transactions (else the client calls
    apply_transaction per transaction, its hooks interleaved as they always were). Callbacks that
    only look like WaltzClientCallbacks (no subclass, no apply_transactions) apply per transaction."""
    method = getattr(type(callbacks), "apply_transactions", None)
    return method is not None and method is not WaltzClientCallbacks.apply_transactions


class WaltzClientCallbacks(ABC):
    """The application side of the feed: where it stands, and how to apply a transaction."""

    @abstractmethod
    def get_client_high_water_mark(self, partition_id: int) -> int:
        """The highest transaction id of the partition already applied (-1: none)."""

    @abstractmethod
    def apply_transaction(self, transaction: Transaction) -> None:
        """Apply one transaction; called strictly in id order per partition, exactly once
        per client unless it raises (then uncaught_exception, and it is applied again)."""

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        """Apply a batch: consecutive transactions of one partition, in id order (never empty).

        The client calls this, with what one feed message brought (up to server.feedBatchSize
        transactions; many while catching up, often one in steady state), when a subclass overrides
        it; else it calls apply_transaction for each, as it always did. Override it to apply a batch
        in one database transaction (the PostgreSQL and SQLite helpers do).

        All or nothing: when it raises, the client reports the error to uncaught_exception and
        calls it again, after a backoff, with the same transactions from the first one. So a batch
        that raises must have applied none of them (roll back), or skip on the retry those it had
        applied (as the helpers do with their stored high-water mark), or raise PartialApplyError
        saying how many it applied: the client then retries from the next one. This default
        applies each with apply_transaction and raises PartialApplyError if one raises."""
        for applied, transaction in enumerate(transactions):
            try:
                self.apply_transaction(transaction)
            except Exception as exc:
                raise PartialApplyError(applied, exc) from exc

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        """apply_transaction or a context hook raised exc (transaction_id -1: not a transaction)."""
        logging.getLogger(__name__).error(
            "partition %d, transaction %d: uncaught exception", partition_id, transaction_id, exc_info=exc)

