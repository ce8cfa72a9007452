"""The exceptions a Waltz client raises to the application: one tree under WaltzError.

Every WaltzError has a ``retriable`` attribute: True when the same call may succeed if made again later
(a timeout, no server answering, a stream that broke), False when something must change first (the
configuration, the transaction, the cluster the client points at, or the client is closed). An application
can catch WaltzError once and decide by ``exc.retriable`` whether to back off and try again.
"""

from __future__ import annotations

from waltz_common.config import ConfigError as _CommonConfigError


class WaltzError(RuntimeError):
    """Base class of every error the Waltz client raises; ``retriable`` says whether trying again may help."""

    retriable: bool = False


class ConfigError(WaltzError, _CommonConfigError):
    """A client configuration key is unknown, missing or has a bad value (also a ValueError, as before)."""

    retriable = False


class UnavailableError(WaltzError, ConnectionError):
    """No server (or, with ZooKeeper discovery, no ZooKeeper) answered within client.requestTimeout."""

    retriable = True


class WaltzTimeoutError(WaltzError, TimeoutError):
    """Something did not happen within its configured timeout (mount, capacity, request)."""

    retriable = True


class WaltzClosedError(WaltzError):
    """The client is closed (or closing): the operation was not carried out."""

    retriable = False


class ClientAheadError(WaltzError):
    """The client high-water mark is above the partition's: wrong cluster or a lost log.

    A configuration error, not something a retry fixes: the partition stays unusable.
    """

    retriable = False

    def __init__(self, partition_id: int, client_high_water_mark: int, partition_high_water_mark: int) -> None:
        super().__init__(
            f"partition {partition_id}: the application has applied up to transaction "
            f"{client_high_water_mark}, but the partition's high-water mark is {partition_high_water_mark}; "
            "is the client pointed at the right cluster (cluster.root), or was the log lost?"
        )
        self.partition_id = partition_id
        self.client_high_water_mark = client_high_water_mark
        self.partition_high_water_mark = partition_high_water_mark


class ClientIdDeniedError(WaltzError):
    """The server refused this client's client id (mutual TLS): it belongs to another identity, another
    certificate's role and subject. Not something a retry fixes: the partition stays unusable."""

    retriable = False

    def __init__(self, partition_id: int, client_id: int, message: str) -> None:
        super().__init__(f"partition {partition_id}: client id {client_id} refused: {message}")
        self.partition_id = partition_id
        self.client_id = client_id


class ApplyError(WaltzError):
    """The application's apply_transaction (or apply_transactions) kept raising while the partition was mounting:
    the mount cannot complete until it applies. Raised, instead of WaltzTimeoutError, by what waits for the mount
    (wait_mounted, submit) when client.mountTimeout passes with the apply failing, chained to the application's
    exception (``__cause__``, also ``error``). The client goes on retrying the apply with backoff, so a later call
    succeeds once the apply does."""

    retriable = True

    def __init__(self, partition_id: int, transaction_id: int, error: BaseException) -> None:
        super().__init__(f"partition {partition_id}: applying transaction {transaction_id} failed: "
                         f"{type(error).__name__}: {error} (the mount waits for it; the client retries the apply)")
        self.partition_id = partition_id
        self.transaction_id = transaction_id
        self.error = error


class RetriesExhaustedError(WaltzError):
    """A transaction context failed client.maxRetries + 1 times and was given up (submitting it again may work)."""

    retriable = True


class TransactionRejectedError(WaltzError):
    """The server refused the transaction itself (too large, bad checksum): retrying cannot help."""

    retriable = False


class TransactionDataError(WaltzError):
    """A transaction's data could not be fetched (or kept failing its checksum)."""

    retriable = True


class StreamClosedError(WaltzError, ConnectionError):
    """A server stream ended or failed; the client reconnects and remounts by itself."""

    retriable = True


class ForkedClientError(WaltzError):
    """The client was made in another process, which then forked this one: its connections, threads and event loop
    stayed in that process, so it cannot serve here. Also raised when a client connecting over gRPC is made in a
    process forked after a client had connected in its parent: gRPC's state came along with the fork, not its threads.
    Make a client in each process after the fork (gunicorn: in post_fork or the application's lifespan; uvicorn
    --workers: in the lifespan), and none in the process that forks."""

    retriable = False

    def __init__(self, created_in: int, *, new_client: bool = False) -> None:
        if new_client:
            message = (
                f"this process was forked from process {created_in} after a client had connected there: gRPC "
                f"cannot connect in a child forked once it was in use (its threads stayed in the parent; a new "
                f"channel would hang or abort the process); create a client in each worker after the fork (gunicorn: "
                f"post_fork / lifespan) and none in the process that forks; see docs/web-services.md")
        else:
            message = (
                f"this client was created in process {created_in} before a fork; create a client in each worker "
                f"after the fork (gunicorn: post_fork / lifespan), not at import time (gunicorn --preload imports the "
                f"application in the master, which then forks); see docs/web-services.md")
        super().__init__(message)
        self.created_in = created_in
