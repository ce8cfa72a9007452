"""The smallest Waltz application: append messages to partition 0 and print every committed one.

Start a local cluster in one terminal (`.venv/bin/waltz dev`), then in another:

    .venv/bin/python examples/hello_waltz.py /tmp/.../client.yaml "hello" "world"

It keeps what it has applied in memory, so each run reads the whole log again from transaction 0;
a real application keeps its high-water mark in its own database (see waltz_client.sqlite_callbacks).
Its transactions carry the header HELLO, and it shows only those: a development log (`waltz dev --data`) keeps
every application's transactions, and each one skips what is not its own (docs/applications.md, A log shared
with other applications).
"""

from __future__ import annotations

import sys
import threading

from waltz_client import Transaction, TransactionBuilder, TransactionContext, WaltzClient, WaltzClientCallbacks

HELLO = 0x68656C6F  # "helo": this application's transactions (TransactionBuilder.set_header; 0 is the default)


class Messages(WaltzClientCallbacks):
    """Applies the feed: this application's messages (header HELLO) of every partition, in id order, in memory;
    the high-water mark moves past every transaction, its own or another application's."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, bytes]] = []
        self.high_water_marks: dict[int, int] = {}
        self.changed = threading.Condition()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.changed:
            if transaction.header == HELLO:
                self.messages.append((transaction.transaction_id, transaction.data()))
            self.high_water_marks[transaction.partition_id] = transaction.transaction_id
            self.changed.notify_all()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        print(f"partition {partition_id} transaction {transaction_id}: {exc!r}", file=sys.stderr)


class Say(TransactionContext):
    """One message for partition 0."""

    def __init__(self, text: str) -> None:
        self.text = text

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(HELLO)
        builder.set_data(self.text.encode())
        return True


def say_and_read(config: str | dict[str, object], texts: list[str], timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Append texts, wait until the feed brings them back, and return every message of partition 0 (this
    application's)."""
    messages = Messages()
    with WaltzClient(messages, config) as client:
        for text in texts:
            if not client.submit(Say(text)).result(timeout=timeout):
                raise RuntimeError(f"{text!r} was not committed")
        last = client.high_water_mark(0)
        with messages.changed:
            if not messages.changed.wait_for(lambda: messages.get_client_high_water_mark(0) >= last, timeout):
                raise TimeoutError(f"the feed did not reach transaction {last} within {timeout} s")
            return list(messages.messages)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: hello_waltz.py CLIENT.yaml [MESSAGE ...]")
    for transaction_id, data in say_and_read(sys.argv[1], sys.argv[2:] or ["hello, waltz"]):
        print(f"{transaction_id:>6}  {data.decode(errors='replace')}")
