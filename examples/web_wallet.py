"""A wallet web service over Waltz (FastAPI): deposits, withdrawals without overdraft, balances.

What docs/web-services.md explains, runnable:
- one AsyncWaltzClient per worker process, made in the application's lifespan (after any fork: gunicorn's pre-forked
  workers, `uvicorn --workers`), closed there within a bound;
- readiness: /ready answers 503 while the client catches up (mounting goes on in the background), so SIGTERM
  during a long catch-up stops the worker at once;
- idempotent requests: each request carries a key; execute() declines a key the database shows applied, and the
  apply records the key in the same database transaction as the change, so a request retried after a time-out or
  a cancelled call commits once;
- read-your-writes: GET /wallets/{wallet}?after=ID waits until this instance has applied transaction ID.

Run it against `waltz dev` (the client's configuration from WALTZ_CLIENT_CONFIG, or WALTZ_CLIENT_SERVERS):

    WALTZ_CLIENT_CONFIG=~/waltz-dev/client.yaml WALLET_DB=wallet.db .venv/bin/uvicorn examples.web_wallet:app
    WALTZ_CLIENT_CONFIG=~/waltz-dev/client.yaml WALLET_DB=wallet.db \
        .venv/bin/gunicorn -k uvicorn_worker.UvicornWorker -w 3 examples.web_wallet:app

The workers of one host share WALLET_DB (SQLite in WAL mode; the helper applies each transaction once, whichever
worker gets there first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from waltz_client import (
    AsyncWaltzClient,
    GuardedConnection,
    PartitionLocalLock,
    SqliteClientCallbacks,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzTimeoutError,
)

HEADER = 0x57414C  # "WAL": this application's transactions; it skips any other (another application's, a test's)
REQUEST_TIMEOUT_S = 10.0  # a request's wait for its commit; past it the outcome is unknown: retry with the same key
CLOSE_TIMEOUT_S = 5.0  # what shutting down waits for the transactions in flight


class Wallets(SqliteClientCallbacks):
    """The service's state: balances, and the idempotency keys applied (both written by apply, in one database
    transaction with the high-water mark)."""

    def create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS wallets (wallet TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
        connection.execute("CREATE TABLE IF NOT EXISTS applied_requests "
                           "(key TEXT PRIMARY KEY, transaction_id INTEGER NOT NULL, outcome TEXT NOT NULL)")

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        if transaction.header != HEADER:
            return  # not this application's: skipped (applying it would raise, and be retried for ever)
        change = json.loads(transaction.data())
        if connection.execute("SELECT 1 FROM applied_requests WHERE key = ?", (change["key"],)).fetchone():
            return  # the same request committed twice (its locks make that rare): the first one counts
        balance = _balance(connection, change["wallet"])
        delta = change["amount"] if change["op"] == "deposit" else -change["amount"]
        outcome = "refused" if balance + delta < 0 else "ok"  # deterministic: every instance decides the same
        if outcome == "ok":
            connection.execute("INSERT INTO wallets VALUES (?, ?) ON CONFLICT (wallet) DO UPDATE SET balance = ?",
                               (change["wallet"], balance + delta, balance + delta))
        connection.execute("INSERT INTO applied_requests VALUES (?, ?, ?)",
                           (change["key"], transaction.transaction_id, outcome))

    def applied_request(self, key: str) -> tuple[int, str] | None:
        """The transaction id and outcome of the request with this key, if applied here."""
        rows = self.query_all("SELECT transaction_id, outcome FROM applied_requests WHERE key = ?", key)
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def balance(self, wallet: str) -> int:
        return _balance(self.connect(), wallet)


def _balance(connection: Any, wallet: str) -> int:
    row = connection.execute("SELECT balance FROM wallets WHERE wallet = ?", (wallet,)).fetchone()
    return int(row[0]) if row else 0


def wallet_partition(wallet: str, num_partitions: int) -> int:
    return zlib.crc32(wallet.encode()) % num_partitions


class Change(TransactionContext):
    """One request: a deposit or a withdrawal of a wallet, under the request's idempotency key."""

    def __init__(self, wallets: Wallets, op: str, wallet: str, amount: int, key: str) -> None:
        self.wallets, self.op, self.wallet, self.amount, self.key = wallets, op, wallet, amount, key
        self.declined_because = ""

    def partition_id(self, num_partitions: int) -> int:
        return wallet_partition(self.wallet, num_partitions)

    def execute(self, builder: TransactionBuilder) -> bool:
        # checked against the applied state, not in apply(): a duplicate is declined here, before anything is sent
        if self.wallets.applied_request(self.key) is not None:
            self.declined_because = "duplicate"
            return False
        if self.op == "withdraw" and self.wallets.balance(self.wallet) < self.amount:
            self.declined_because = "insufficient funds"
            return False
        builder.set_header(HEADER)
        builder.set_data(json.dumps({"op": self.op, "wallet": self.wallet, "amount": self.amount,
                                     "key": self.key}).encode())
        # the wallet's lock: no overdraft from a stale balance; the key's: two tries of one request in flight at
        # once cannot both commit (the second fails its lock, executes again, and finds the key applied)
        builder.set_write_locks([PartitionLocalLock("wallet", zlib.crc32(self.wallet.encode())),
                                 PartitionLocalLock("request", zlib.crc32(self.key.encode()))])
        return True


class ChangeRequest(BaseModel):
    amount: int = Field(gt=0)
    key: str = Field(min_length=1, max_length=200)  # the idempotency key: the same for every retry of a request


OnReady = Callable[[AsyncWaltzClient, Wallets], Awaitable[None]]


async def mount_in_background(client: AsyncWaltzClient, wallets: Wallets, ready: asyncio.Event,
                              on_ready: OnReady | None) -> None:
    """Set ready once every partition is mounted (caught up); until then /ready says 503."""
    while True:
        try:
            await client.wait_mounted()
        except WaltzTimeoutError:
            continue  # still catching up (client.mountTimeout bounds each wait, not the catch-up)
        ready.set()
        if on_ready is not None:
            await on_ready(client, wallets)
        return


def make_app(make_wallets: Callable[[str], Wallets] = Wallets, on_ready: OnReady | None = None) -> FastAPI:
    """The service; make_wallets builds its callbacks from the database path (WALLET_DB); on_ready runs in each
    worker once it is caught up (to register it somewhere, say)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # in the worker, after any fork: a client made before it (at import, in a --preload master) cannot serve
        wallets = make_wallets(os.environ.get("WALLET_DB", "wallet.db"))
        client = AsyncWaltzClient(wallets)  # configuration: WALTZ_CLIENT_CONFIG, or WALTZ_CLIENT_* variables
        await client.start()  # connects and takes a client id; the mounts (the catch-up) go on in the background
        ready = asyncio.Event()
        mounting = asyncio.create_task(mount_in_background(client, wallets, ready, on_ready))
        app.state.client, app.state.wallets, app.state.ready = client, wallets, ready
        try:
            yield
        finally:  # SIGTERM: stop within a bound, catching up or not
            mounting.cancel()
            await client.close(timeout=CLOSE_TIMEOUT_S)
            wallets.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "alive"}  # liveness: the process answers (a catch-up is no reason to restart it)

    @app.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        if request.app.state.ready.is_set():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "catching up"}, status_code=503)

    @app.post("/wallets/{wallet}/{op}")
    async def change(wallet: str, op: str, body: ChangeRequest, request: Request) -> dict[str, Any]:
        if op not in ("deposit", "withdraw"):
            raise HTTPException(404, f"no operation {op}")
        state = request.app.state
        context = Change(state.wallets, op, wallet, body.amount, body.key)
        try:
            committed = await state.client.submit_and_wait(context, timeout=REQUEST_TIMEOUT_S)
        except WaltzTimeoutError:  # it may still commit: the client retries the request with the same key
            raise HTTPException(504, "the outcome is not known yet; retry with the same key") from None
        partition = wallet_partition(wallet, state.client.num_partitions)
        if committed:
            return {"status": "ok", "partition": partition, "transaction_id": context.committed_transaction_id}
        if context.declined_because == "duplicate":
            applied = await asyncio.to_thread(state.wallets.applied_request, body.key)
            assert applied is not None
            return {"status": "duplicate", "partition": partition, "transaction_id": applied[0],
                    "outcome": applied[1]}
        raise HTTPException(409, context.declined_because)

    @app.get("/wallets/{wallet}")
    async def balance(wallet: str, request: Request, after: int = -1) -> dict[str, Any]:
        state = request.app.state
        partition = wallet_partition(wallet, state.client.num_partitions)
        if after >= 0:  # read-your-writes: the transaction another instance answered with is applied here first
            try:
                await state.client.wait_applied(partition, after, timeout=REQUEST_TIMEOUT_S)
            except WaltzTimeoutError:
                raise HTTPException(504, f"transaction {after} is not applied here yet") from None
        # SQLite reads block: off the event loop
        return {"wallet": wallet, "balance": await asyncio.to_thread(state.wallets.balance, wallet)}

    return app


app = make_app()
