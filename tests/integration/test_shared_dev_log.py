"""A log shared by applications (issue 43): the README keeps its development log (`waltz dev --data`) and runs
examples/hello_waltz.py, which leaves plain-text messages there. An application whose apply() parses its own
format (JSON here, into SQLite with the helper) mounts on that log when it skips what does not carry its header,
as docs/applications.md says (A log shared with other applications), and never mounts when it does not: the
client retries the failing apply. hello_waltz, tagged too, shows only its own messages afterwards."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli.test_waltz_dev import hello
from waltz_client import ApplyError, Transaction, TransactionBuilder, TransactionContext, WaltzClient
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks
from waltz_common.testing.local_cluster import LocalCluster

LEDGER = 0x6C656467


class Ledger(SqliteClientCallbacks):
    """Entries in JSON; `checks_header` False: the application as written before it knew the log was shared."""

    checks_header = True

    def create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS entries (account TEXT, amount INTEGER)")

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        if self.checks_header and transaction.header != LEDGER:
            return
        entry = json.loads(transaction.data())
        connection.execute("INSERT INTO entries VALUES (?, ?)", (entry["account"], entry["amount"]))


class Post(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(LEDGER)
        builder.set_data(json.dumps({"account": "alice", "amount": 10}).encode())
        return True


def test_an_application_with_its_own_format_mounts_on_a_log_hello_waltz_wrote_to(
        tmp_path: Path, zookeeper: Any) -> None:
    app = hello()
    with LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=1, partitions=1,
                      cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string) as cluster:
        config = cluster.client_config()
        assert app.say_and_read(config, ["hello", "world"]) == [(0, b"hello"), (1, b"world")]

        careless = Ledger(tmp_path / "careless.db")
        careless.checks_header = False
        with careless, WaltzClient(careless, config, overrides={"client.mountTimeout": 5}) as client, \
                pytest.raises(ApplyError, match="JSONDecodeError"):
            client.wait_mounted()  # hello's plain text: the apply fails, and is retried for ever

        with Ledger(tmp_path / "ledger.db") as ledger, WaltzClient(ledger, config) as client:
            client.wait_mounted()
            assert client.submit_and_wait(Post(), timeout=60)
            client.flush()
            assert ledger.query_all("SELECT account, amount FROM entries") == [("alice", 10)]
            assert ledger.get_client_high_water_mark(0) == 2  # past hello's two, and its own

        assert app.say_and_read(config, ["again"]) == [(0, b"hello"), (1, b"world"), (3, b"again")]
