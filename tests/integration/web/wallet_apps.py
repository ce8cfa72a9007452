"""examples/web_wallet.py as the web-service tests run it under uvicorn and gunicorn: `app` is the documented
pattern (a client per worker, made in the lifespan), with an apply slowed by WALLET_APPLY_DELAY seconds per
transaction (a long catch-up) and a deposit each worker commits once caught up (which workers serve)."""

from __future__ import annotations

import os
import time

from examples.web_wallet import Change, Wallets, make_app
from waltz_client import AsyncWaltzClient, GuardedConnection, Transaction


class SlowWallets(Wallets):
    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        time.sleep(float(os.environ.get("WALLET_APPLY_DELAY", "0")))
        super().apply(transaction, connection)


async def report_worker(client: AsyncWaltzClient, wallets: Wallets) -> None:
    """Commit a deposit keyed by this worker's pid: the test reads which workers committed."""
    key = f"worker-{os.environ.get('WALLET_RUN', '')}-{os.getpid()}"
    assert await client.submit_and_wait(Change(wallets, "deposit", "workers", 1, key), timeout=60)


app = make_app(SlowWallets, on_ready=report_worker)
