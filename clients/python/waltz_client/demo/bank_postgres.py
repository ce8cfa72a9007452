"""The demo bank's tables in PostgreSQL (imported only for a postgresql:// database: psycopg is optional)."""

from __future__ import annotations

from waltz_client.api import Transaction
from waltz_client.demo.bank import BankSchema
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks


class PostgresBankDatabase(BankSchema, PostgresClientCallbacks):
    """Accounts and a journal of applied operations, in a PostgreSQL database the instances share."""

    PARAM = "%s"

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        BankSchema.apply(self, transaction, connection)
