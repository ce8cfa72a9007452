"""One application process of the close test: submits transactions without waiting for them, then leaves the
client's `async with` (which flushes them). Prints its futures' outcomes as JSON on stdout.

    python -m tests.integration.client.close_process CONFIG.json COUNT [--no-flush]
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections import Counter
from typing import Any

from waltz_client import (
    AsyncWaltzClient,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
    WaltzTimeoutError,
)


class Hwm(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.hwm: dict[int, int] = {}

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        self.hwm[transaction.partition_id] = transaction.transaction_id


class Append(TransactionContext):
    def __init__(self, n: int) -> None:
        self.n = n

    def partition_id(self, num_partitions: int) -> int:
        return self.n % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"close-%d" % self.n)
        return True


async def main(config: dict[str, Any], count: int, flush: bool) -> dict[str, int]:
    outcomes: Counter[str] = Counter()
    client = AsyncWaltzClient(Hwm(), config)
    await client.start()
    await client.wait_mounted()
    futures = [await client.submit(Append(n)) for n in range(count)]
    try:
        await client.submit_and_wait(Append(count), timeout=0.0001)  # the case: its future is the client's
        outcomes["waited"] += 1
    except WaltzTimeoutError:
        outcomes["gave up waiting"] += 1
    await (client.close() if flush else client.close(flush=False))  # close(): what leaving `async with` does
    for future in futures:
        try:
            outcomes[str(await future)] += 1
        except Exception as exc:
            outcomes[type(exc).__name__] += 1
    del futures
    gc.collect()  # an unretrieved future's exception is reported when it is collected
    await asyncio.sleep(0.1)
    return dict(outcomes)


if __name__ == "__main__":
    with open(sys.argv[1]) as file:
        configuration = json.load(file)
    print(json.dumps(asyncio.run(main(configuration, int(sys.argv[2]), "--no-flush" not in sys.argv))), flush=True)
