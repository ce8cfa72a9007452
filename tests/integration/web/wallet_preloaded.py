"""The mistake docs/web-services.md warns of: a client opened at import time. Under gunicorn --preload the master
imports this module, so the client connects in the master and every worker forks with it; a worker's lifespan then
uses it, and must fail at once with ForkedClientError (not hang, not crash). Without --preload each worker imports
the module itself, and it works."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI

from examples.web_wallet import Wallets
from waltz_client import WaltzClient

CLIENT = WaltzClient(Wallets(os.environ["WALLET_DB"]))  # configuration: WALTZ_CLIENT_CONFIG


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await asyncio.to_thread(CLIENT.wait_mounted)  # in a worker forked from the client's process: ForkedClientError
    yield
    await asyncio.to_thread(CLIENT.close)


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, int]:
    return {"client_id": CLIENT.client_id}
