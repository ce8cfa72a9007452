"""Demo bank: balances in SQLite (or PostgreSQL) fed by Waltz; withdrawals guarded by locks never overdraw.

Run against a cluster: `python -m waltz_client.demo.bank --zookeeper HOST:PORT --root /waltz/my_cluster`
(add `--database postgresql://USER@HOST:PORT/DB` to share a PostgreSQL database instead of SQLite).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_client.api import JsonSerializer, Transaction, TransactionBuilder, TransactionContext
from waltz_client.blocking import WaltzClient
from waltz_client.locks import PartitionLocalLock
from waltz_client.mock import MockServer
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks

SERIALIZER = JsonSerializer()
BANK_HEADER = 0x42414E4B  # "BANK": the log may hold other applications' transactions too


class BankSchema:
    """The bank's tables and its apply, in SQL that SQLite and PostgreSQL both take; PARAM is the
    driver's placeholder. Mixed into a helper class (SqliteClientCallbacks, PostgresClientCallbacks)."""

    PARAM = "?"
    query_all: Callable[..., list[Any]]  # the helper's

    def create_schema(self, connection: Any) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS accounts "
                           "(account_id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)")
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                           "op_id TEXT UNIQUE, account_id INTEGER, delta BIGINT, balance_after BIGINT, "
                           "PRIMARY KEY (partition_id, transaction_id))")

    def apply(self, transaction: Transaction, connection: Any) -> None:
        if transaction.header != BANK_HEADER:
            return  # not ours: only the high-water mark moves
        op = transaction.data(SERIALIZER)
        delta = op["amount"] if op["action"] == "deposit" else -op["amount"]
        q = self.PARAM
        connection.execute(f"INSERT INTO accounts (account_id, balance) VALUES ({q}, 0) "
                           "ON CONFLICT (account_id) DO NOTHING", (op["account"],))
        connection.execute(f"UPDATE accounts SET balance = balance + {q} WHERE account_id = {q}",
                           (delta, op["account"]))
        balance = connection.execute(f"SELECT balance FROM accounts WHERE account_id = {q}",
                                     (op["account"],)).fetchone()[0]
        connection.execute(f"INSERT INTO journal VALUES ({q}, {q}, {q}, {q}, {q}, {q})", (
            transaction.partition_id, transaction.transaction_id, op["op"], op["account"], delta, balance))

    def balance(self, account: int) -> int:
        rows = self.query_all(f"SELECT balance FROM accounts WHERE account_id = {self.PARAM}", account)
        return int(rows[0][0]) if rows else 0


class BankDatabase(BankSchema, SqliteClientCallbacks):
    """Accounts and a journal of applied operations (its primary key catches a double apply), in SQLite."""

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        BankSchema.apply(self, transaction, connection)


def open_database(database: str | Path) -> BankDatabase | Any:
    """One instance's database: a postgresql:// URI (PostgresBankDatabase) or a SQLite file."""
    if str(database).startswith(("postgresql://", "postgres://")):
        from waltz_client.demo.bank_postgres import PostgresBankDatabase  # psycopg: the postgres extra

        return PostgresBankDatabase(str(database))
    return BankDatabase(database)


@dataclass
class Tally:
    """What the contexts of one run heard (thread-safe counters)."""

    sent: set[str] = field(default_factory=set)  # op ids that reached an append
    committed: dict[str, tuple[int, int]] = field(default_factory=dict)  # op id -> (account, delta)
    declined: int = 0
    lock_failures: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Operation(TransactionContext):
    def __init__(self, account: int, amount: int, tally: Tally) -> None:
        self.account, self.amount, self.tally = account, amount, tally
        self.op_id = uuid.uuid4().hex

    def partition_id(self, num_partitions: int) -> int:
        return self.account % num_partitions

    def _build(self, builder: TransactionBuilder, action: str) -> None:
        builder.set_header(BANK_HEADER)
        builder.set_data({"op": self.op_id, "action": action, "account": self.account, "amount": self.amount},
                         SERIALIZER)
        with self.tally.lock:
            self.tally.sent.add(self.op_id)

    def on_completion(self, committed: bool) -> None:
        with self.tally.lock:
            if committed:
                delta = self.amount if isinstance(self, Deposit) else -self.amount
                self.tally.committed[self.op_id] = (self.account, delta)
            else:
                self.tally.declined += 1

    def on_lock_failure(self) -> None:
        with self.tally.lock:
            self.tally.lock_failures += 1

    def on_exception(self, exc: BaseException) -> None:
        with self.tally.lock:
            self.tally.errors.append(f"{type(exc).__name__}: {exc}")


class Deposit(_Operation):
    """Deposits need no lock: they only make a later withdrawal's check more conservative."""

    def execute(self, builder: TransactionBuilder) -> bool:
        self._build(builder, "deposit")
        return True


class Withdrawal(_Operation):
    """Checks the balance it reads; the write lock makes concurrent withdrawals serialize."""

    def __init__(self, account: int, amount: int, tally: Tally, database: BankSchema) -> None:
        super().__init__(account, amount, tally)
        self.database = database

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.database.balance(self.account) < self.amount:
            return False  # insufficient funds: declined
        self._build(builder, "withdrawal")
        builder.set_write_locks([PartitionLocalLock("withdrawal", self.account)])
        builder.set_read_locks([PartitionLocalLock("account", self.account)])
        return True


@dataclass
class DemoReport:
    clients: int
    submitted: int
    committed: int
    declined: int
    lock_failures: int
    retries: int
    errors: list[str]
    balances: dict[int, int]
    expected_balances: dict[int, int]
    lowest_balance: int
    applied: int
    skipped_duplicates: int
    high_water_marks: dict[int, int]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        return [
            f"  submitted {self.submitted} transactions from {self.clients} concurrent clients",
            f"  committed {self.committed}, declined {self.declined} (insufficient funds), "
            f"errors {len(self.errors)}",
            f"  lock failures {self.lock_failures}, retries {self.retries}",
            f"  applied {self.applied} transactions once each; {self.skipped_duplicates} deliveries to other "
            "instances skipped by the high-water-mark compare-and-set",
            "  final balances: " + ", ".join(f"account {a}: {b}" for a, b in sorted(self.balances.items())),
            f"  lowest balance ever: {self.lowest_balance}",
            "  consistency: " + ("OK" if self.ok else "FAILED: " + "; ".join(self.problems)),
        ]


def run_demo(
    target: MockServer | Mapping[str, Any] | str | Path, *, num_clients: int = 3, num_transactions: int = 200,
    num_accounts: int = 4, initial_balance: int = 100, database: str | Path | None = None, seed: int = 1,
    client_config: Mapping[str, Any] | None = None, out: Callable[[str], None] | None = print,
) -> DemoReport:
    """Run the bank with num_clients instances sharing one database and report.

    target: a MockServer, or a client configuration (mapping or YAML path) for a real cluster.
    database: a SQLite file (default: one in a temporary directory) or a postgresql:// URI.
    """
    say = out or (lambda _line: None)
    with tempfile.TemporaryDirectory(prefix="waltz-bank-") as tmp:
        db_path = database if database is not None else Path(tmp) / "bank.db"
        mock = target if isinstance(target, MockServer) else None
        config: dict[str, Any] = {} if isinstance(target, MockServer) else _as_mapping(target)
        config.update(client_config or {})
        tally = Tally()
        databases: list[Any] = [open_database(db_path) for _ in range(num_clients)]
        clients: list[WaltzClient] = []
        try:
            for db in databases:
                clients.append(WaltzClient(db, config, driver=mock))
            for c in clients:
                c.wait_mounted()
            say(f"bank demo: {num_clients} clients, cluster '{clients[0].cluster_name}' with "
                f"{clients[0].num_partitions} partitions, database {getattr(databases[0], 'where', db_path)}")
            deposits = [Deposit(a, initial_balance, tally) for a in range(num_accounts)]
            for f in [clients[0].submit(d) for d in deposits]:
                f.result()
            _run_workload(clients, databases, tally, num_transactions, num_accounts, seed)
            for c in clients:
                c.flush()
            hwms = _wait_caught_up(clients)
            return _report(clients, databases, tally, hwms, num_transactions + num_accounts, say)
        finally:
            for c in clients:
                c.close()
            for db in databases:
                db.close()


def _as_mapping(target: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(target, str | Path):
        import yaml

        loaded = yaml.safe_load(Path(target).read_text()) or {}
        return dict(loaded)
    return dict(target)


def _run_workload(clients: list[WaltzClient], databases: list[BankSchema], tally: Tally,
                  num_transactions: int, num_accounts: int, seed: int) -> None:
    rng = random.Random(seed)
    plans: list[list[_Operation]] = [[] for _ in clients]
    for i in range(num_transactions):
        k = i % len(clients)
        account = rng.randrange(num_accounts)
        if rng.random() < 0.35:
            plans[k].append(Deposit(account, rng.randint(1, 30), tally))
        else:
            plans[k].append(Withdrawal(account, rng.randint(10, 60), tally, databases[k]))

    def drive(k: int) -> None:
        futures = [clients[k].submit(op) for op in plans[k]]
        concurrent.futures.wait(futures)

    with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(drive, range(len(clients))))


def _wait_caught_up(clients: list[WaltzClient], timeout: float = 60.0) -> dict[int, int]:
    partitions = range(clients[0].num_partitions)
    hwms = {p: clients[0].high_water_mark(p) for p in partitions}
    deadline = time.monotonic() + timeout
    while any(c.client_high_water_mark(p) < hwms[p] for c in clients for p in partitions):
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return hwms


def _report(clients: list[WaltzClient], databases: list[Any], tally: Tally, hwms: dict[int, int],
            submitted: int, say: Callable[[str], None]) -> DemoReport:
    problems: list[str] = []
    db = databases[0]
    balances = dict(db.query_all("SELECT account_id, balance FROM accounts"))
    journal = db.query_all("SELECT op_id, account_id, delta, balance_after FROM journal")
    expected: dict[int, int] = {}
    for _op, account, delta, _after in journal:
        expected[account] = expected.get(account, 0) + delta
    if expected != balances:
        problems.append(f"balances {balances} differ from the journal's sums {expected}")
    lowest = min((after for *_rest, after in journal), default=0)
    if lowest < 0:
        problems.append(f"a balance went negative ({lowest})")
    journaled = {op for op, *_rest in journal}
    missing = [op for op in tally.committed if op not in journaled]
    if missing:
        problems.append(f"{len(missing)} committed operations were never applied")
    phantom = (tally.sent - set(tally.committed)) & journaled
    if phantom:
        problems.append(f"{len(phantom)} operations applied although the client reported them not committed")
    stored = dict(db.query_all(f"SELECT partition_id, high_water_mark FROM {db.table}"))
    if stored != hwms:
        problems.append(f"database high-water marks {stored} differ from the log's {hwms}")
    behind = [(c.client_id, p) for c in clients for p, h in hwms.items() if c.client_high_water_mark(p) != h]
    if behind:
        problems.append(f"clients not caught up: {behind}")
    if tally.errors:
        problems.append(f"{len(tally.errors)} errors, first: {tally.errors[0]}")
    report = DemoReport(
        clients=len(clients), submitted=submitted, committed=len(tally.committed), declined=tally.declined,
        lock_failures=tally.lock_failures, retries=sum(c.stats.retries for c in clients), errors=tally.errors,
        balances=balances, expected_balances=expected, lowest_balance=lowest, applied=len(journal),
        skipped_duplicates=sum(d.skipped for d in databases), high_water_marks=hwms, problems=problems,
    )
    for line in report.lines():
        say(line)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="waltz-bank-demo", description=__doc__)
    parser.add_argument("--zookeeper", help="ZooKeeper connect string (omit to use the in-memory mock)")
    parser.add_argument("--root", default="/waltz/my_cluster", help="the cluster root znode")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--accounts", type=int, default=4)
    parser.add_argument("--database", help="a postgresql://USER@HOST:PORT/DB URI the instances share "
                        "(needs the postgres extra: psycopg), or a SQLite file (default: a temporary one)")
    args = parser.parse_args(argv)
    target: MockServer | dict[str, Any] = (
        {"zookeeper.connectString": args.zookeeper, "cluster.root": args.root} if args.zookeeper else MockServer(2))
    report = run_demo(target, num_clients=args.clients, num_transactions=args.transactions,
                      num_accounts=args.accounts, database=args.database)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
