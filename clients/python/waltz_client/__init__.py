"""Waltz Python client: WaltzClient, transaction contexts and callbacks.

Every exception it raises is a WaltzError (ConfigError, UnavailableError, WaltzTimeoutError, ...), each with a
``retriable`` attribute: see waltz_client.errors.
"""

from waltz_client.api import (
    JsonSerializer,
    Serializer,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
)
from waltz_client.blocking import WaltzClient
from waltz_client.client import AsyncWaltzClient
from waltz_client.config import CLIENT_KEYS
from waltz_client.errors import (
    ClientAheadError,
    ClientIdDeniedError,
    ConfigError,
    RetriesExhaustedError,
    TransactionDataError,
    TransactionRejectedError,
    UnavailableError,
    WaltzClosedError,
    WaltzError,
    WaltzTimeoutError,
)
from waltz_client.locks import PartitionLocalLock
from waltz_client.mock import MockServer

__all__ = [
    "CLIENT_KEYS",
    "AsyncWaltzClient",
    "ClientAheadError",
    "ClientIdDeniedError",
    "ConfigError",
    "JsonSerializer",
    "MockServer",
    "PartitionLocalLock",
    "RetriesExhaustedError",
    "Serializer",
    "Transaction",
    "TransactionBuilder",
    "TransactionContext",
    "TransactionDataError",
    "TransactionRejectedError",
    "UnavailableError",
    "WaltzClient",
    "WaltzClientCallbacks",
    "WaltzClosedError",
    "WaltzError",
    "WaltzTimeoutError",
]
