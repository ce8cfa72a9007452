"""A wallet web service as a service author writes one (bench/web_service.py runs three of them under load).

    python -m bench.web_wallet --config client.yaml --dsn DSN --port PORT [--sync-helper]

FastAPI under uvicorn, an AsyncWaltzClient made in the lifespan and AsyncPostgresClientCallbacks (or, with
--sync-helper, the synchronous PostgresClientCallbacks, for comparison) applying the log into the instance's own
PostgreSQL database: POST /deposit/{wallet}/{amount}, POST /withdraw/{wallet}/{amount}
(declined, 409, when the balance the instance has applied is short: never an overdraft, because the append takes
the wallet's write lock and a lock failure re-executes the check), GET /balance/{wallet}, and GET /stats (the
client's counters and callback queue, for the benchmark's diagnosis).
"""

from __future__ import annotations

import argparse
import asyncio
import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException

from waltz_client import AsyncWaltzClient, PartitionLocalLock, Transaction, TransactionBuilder, TransactionContext
from waltz_client.postgres_async import AsyncPgGuardedConnection, AsyncPostgresClientCallbacks
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks

WALLET_HEADER = 0x57414C  # "WAL": this application's transactions (a shared development log holds others')
BALANCE_SQL = "SELECT balance FROM wallets WHERE wallet = %s"


SCHEMA = "CREATE TABLE IF NOT EXISTS wallets (wallet TEXT PRIMARY KEY, balance BIGINT NOT NULL)"
MOVE_SQL = ("INSERT INTO wallets VALUES (%s, %s) ON CONFLICT (wallet) "
            "DO UPDATE SET balance = wallets.balance + EXCLUDED.balance")


def move_of(transaction: Transaction) -> tuple[str, int] | None:
    """(wallet, signed amount) of a wallet transaction; None for another application's (skipped: the helper still
    moves the high-water mark past it)."""
    if transaction.header != WALLET_HEADER:
        return None
    wallet, amount = transaction.data().decode().split()
    return wallet, int(amount)


class Wallets(AsyncPostgresClientCallbacks):
    """Balances, moved by the log's deposits and withdrawals (data: b"WALLET AMOUNT", amount signed)."""

    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        await connection.execute(SCHEMA)

    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        if (move := move_of(transaction)) is not None:
            await connection.execute(MOVE_SQL, move)

    def balance_blocking(self, wallet: str) -> list[Any]:
        return self.query_all_blocking(BALANCE_SQL, wallet)

    async def balance(self, wallet: str) -> list[Any]:
        return await self.query_all(BALANCE_SQL, wallet)


class SyncWallets(PostgresClientCallbacks):
    """Wallets with the synchronous helper: the same SQL on the callback thread's own connection."""

    def create_schema(self, connection: PgGuardedConnection) -> None:
        connection.execute(SCHEMA)

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        if (move := move_of(transaction)) is not None:
            connection.execute(MOVE_SQL, move)

    def balance_blocking(self, wallet: str) -> list[Any]:
        return list(self.connect().execute(BALANCE_SQL, (wallet,)).fetchall())

    async def balance(self, wallet: str) -> list[Any]:
        return await asyncio.to_thread(self.balance_blocking, wallet)


class Move(TransactionContext):
    """A deposit (amount > 0) or a withdrawal (amount < 0, checked against the applied balance)."""

    def __init__(self, wallets: Wallets | SyncWallets, wallet: str, amount: int) -> None:
        self.wallets, self.wallet, self.amount = wallets, wallet, amount

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.amount < 0:
            rows = self.wallets.balance_blocking(self.wallet)
            if not rows or rows[0][0] + self.amount < 0:
                return False
        builder.set_header(WALLET_HEADER)
        builder.set_data(f"{self.wallet} {self.amount}".encode())
        builder.set_write_locks([PartitionLocalLock("wallet", zlib.crc32(self.wallet.encode()))])
        return True


def make_app(config: str, dsn: str, sync_helper: bool = False) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if sync_helper:
                wallets: Wallets | SyncWallets = stack.enter_context(SyncWallets(dsn))
            else:
                wallets = await stack.enter_async_context(Wallets(dsn))
            client = await stack.enter_async_context(AsyncWaltzClient(wallets, config))
            await client.wait_mounted()
            app.state.wallets, app.state.client = wallets, client
            yield

    app = FastAPI(lifespan=lifespan)

    async def move(wallet: str, amount: int) -> dict[str, Any]:
        if not await app.state.client.submit_and_wait(Move(app.state.wallets, wallet, amount), timeout=60):
            raise HTTPException(409, "insufficient funds")
        return {"ok": True}

    @app.post("/deposit/{wallet}/{amount}")
    async def deposit(wallet: str, amount: int) -> dict[str, Any]:
        return await move(wallet, amount)

    @app.post("/withdraw/{wallet}/{amount}")
    async def withdraw(wallet: str, amount: int) -> dict[str, Any]:
        return await move(wallet, -amount)

    @app.get("/balance/{wallet}")
    async def balance(wallet: str) -> dict[str, Any]:
        rows = await app.state.wallets.balance(wallet)
        return {"balance": rows[0][0] if rows else 0}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        client: AsyncWaltzClient = app.state.client
        queued, busy = client.metric_callback_thread()
        return {**client.metric_counters(), "callback_queue": queued, "callback_busy_s": busy,
                "client_high_water_mark": client.client_high_water_mark(0)}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the client's YAML configuration")
    parser.add_argument("--dsn", required=True, help="the instance's PostgreSQL database")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sync-helper", action="store_true", help="PostgresClientCallbacks instead of the asyncio one")
    args = parser.parse_args(argv)
    app = make_app(args.config, args.dsn, args.sync_helper)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                                           access_log=False))
    asyncio.run(server.serve())


if __name__ == "__main__":
    main()
