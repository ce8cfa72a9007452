"""A WSGI service for gunicorn's pre-forked workers (tests/integration/client/test_web_workers.py), set up as
docs/client-guide.md's "Metrics under multi-process servers" says: a client per worker, made after the fork
(post_fork), its metrics in prometheus_client's multiprocess mode, /metrics answered by a MultiProcessCollector
over every worker's values, and a dead worker's live gauges removed (child_exit).

    PROMETHEUS_MULTIPROC_DIR=DIR WEB_APP_CLIENT_CONFIG=client.yaml \\
        gunicorn -w 3 --no-control-socket -c tests/integration/client/web_workers_app.py \\
        tests.integration.client.web_workers_app:app

POST /submit appends a transaction and answers 200 once committed; GET /metrics, GET /pid.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from waltz_client import Transaction, TransactionBuilder, TransactionContext, WaltzClient, WaltzClientCallbacks

client: WaltzClient | None = None


class Applied(WaltzClientCallbacks):
    """Counts what it applies, in memory (each worker reads the log from the start)."""

    def __init__(self) -> None:
        self.marks: dict[int, int] = {}
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.marks.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        with self.lock:
            self.marks[transaction.partition_id] = transaction.transaction_id


class Append(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"x")
        return True


# ---- gunicorn's hooks (this module is the -c configuration file too) ----------------------------------------

def post_fork(server: Any, worker: Any) -> None:
    # gunicorn runs its -c file as a module of its own: the client goes into the application's module
    from tests.integration.client import web_workers_app

    web_workers_app.client = WaltzClient(Applied(), os.environ["WEB_APP_CLIENT_CONFIG"], metrics_registry=REGISTRY)


def child_exit(server: Any, worker: Any) -> None:
    multiprocess.mark_process_dead(worker.pid)


# ---- the WSGI application ----------------------------------------------------------------------------------

def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
    status, body, kind = "200 OK", b"", "text/plain"
    if method == "POST" and path == "/submit":
        assert client is not None
        if not client.submit(Append()).result(timeout=60):
            status = "409 Conflict"
    elif path == "/metrics":
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        body, kind = generate_latest(registry), CONTENT_TYPE_LATEST
    elif path == "/pid":
        body = str(os.getpid()).encode()
    else:
        status = "404 Not Found"
    start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
    return [body]
