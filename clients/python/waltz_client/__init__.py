"""Waltz Python client: WaltzClient, transaction contexts and callbacks."""

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
    RetriesExhaustedError,
    TransactionDataError,
    TransactionRejectedError,
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
    "WaltzClient",
    "WaltzClientCallbacks",
    "WaltzClosedError",
    "WaltzError",
    "WaltzTimeoutError",
]
