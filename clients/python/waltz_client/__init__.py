"""Waltz Python client: WaltzClient, transaction contexts and callbacks.

Every exception it raises is a WaltzError (ConfigError, UnavailableError, WaltzTimeoutError, ...), each with a
``retriable`` attribute: see waltz_client.errors.

The database helpers are here too: SqliteClientCallbacks, and (with the postgres extra, psycopg 3)
PostgresClientCallbacks and AsyncPostgresClientCallbacks, imported on first use so that the client needs no psycopg.
"""

import importlib
from typing import TYPE_CHECKING, Any

from waltz_client.api import (
    JsonSerializer,
    PartialApplyError,
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
    ApplyError,
    ClientAheadError,
    ClientIdDeniedError,
    ConfigError,
    ForkedClientError,
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
from waltz_client.sqlite_callbacks import ForbiddenCallError, GuardedConnection, SqliteClientCallbacks

if TYPE_CHECKING:  # for type checkers: at run time, __getattr__ imports them when first asked for
    from waltz_client.postgres_async import AsyncPgGuardedConnection as AsyncPgGuardedConnection
    from waltz_client.postgres_async import AsyncPostgresClientCallbacks as AsyncPostgresClientCallbacks
    from waltz_client.postgres_callbacks import DatabaseUnavailableError as DatabaseUnavailableError
    from waltz_client.postgres_callbacks import PgGuardedConnection as PgGuardedConnection
    from waltz_client.postgres_callbacks import PostgresClientCallbacks as PostgresClientCallbacks

_POSTGRES = {  # name -> its module: imported when first asked for (they need psycopg)
    "PostgresClientCallbacks": "waltz_client.postgres_callbacks",
    "PgGuardedConnection": "waltz_client.postgres_callbacks",
    "DatabaseUnavailableError": "waltz_client.postgres_callbacks",
    "AsyncPostgresClientCallbacks": "waltz_client.postgres_async",
    "AsyncPgGuardedConnection": "waltz_client.postgres_async",
}


def __getattr__(name: str) -> Any:
    module = _POSTGRES.get(name)
    if module is None:
        raise AttributeError(f"module 'waltz_client' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        from waltz_common.entry import install_command

        raise ImportError(f"waltz_client.{name} needs psycopg 3: {install_command('postgres')} "
                          f"({exc})", name=name) from exc
    return getattr(imported, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_POSTGRES])


__all__ = [  # without the PostgreSQL helpers: `import *` must not need psycopg
    "CLIENT_KEYS",
    "ApplyError",
    "AsyncWaltzClient",
    "ClientAheadError",
    "ClientIdDeniedError",
    "ConfigError",
    "ForbiddenCallError",
    "ForkedClientError",
    "GuardedConnection",
    "JsonSerializer",
    "MockServer",
    "PartialApplyError",
    "PartitionLocalLock",
    "RetriesExhaustedError",
    "Serializer",
    "SqliteClientCallbacks",
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
