"""examples/web_wallet.py (docs/web-services.md) as real processes against a real local cluster: gunicorn with
pre-forked uvicorn workers, with and without --preload; a client opened in a --preload master (workers fail at once
with ForkedClientError); idempotent retries; read-your-writes across workers; SIGTERM during a long catch-up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from examples.web_wallet import HEADER
from waltz_client import AsyncWaltzClient, TransactionBuilder, TransactionContext
from waltz_common.testing.local_cluster import LocalCluster, free_port
from waltz_common.testing.zookeeper import ZooKeeperProcess

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
WORKERS = 3
BOOT_TIMEOUT_S = 90.0  # generous: the machine is shared; nothing here measures time


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("web-cluster"), storage_nodes=1, servers=1, partitions=2,
                      cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string,
                      server_overrides={"server.feedBatchSize": 50}) as c:  # small batches: a shutdown waits for one
        yield c


class Service:
    """A web server process (gunicorn or uvicorn) in a process group of its own, with its output in files."""

    def __init__(self, argv: list[str], workdir: Path, cluster: LocalCluster, **env: str) -> None:
        config = workdir / "client.yaml"
        config.write_text(yaml.safe_dump({"client.servers": cluster.servers[0].address,
                                          "client.mountTimeout": 2}))
        self.port = free_port()
        self.db = workdir / "wallet.db"
        self.out = workdir / "service.log"
        environ = {**os.environ, "WALTZ_CLIENT_CONFIG": str(config), "WALLET_DB": str(self.db),
                   "PYTHONPATH": str(ROOT), **env}
        argv = [a.replace("PORT", str(self.port)) for a in argv]
        with self.out.open("wb") as out:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def workers(self) -> list[int]:
        return sorted(child.pid for child in psutil.Process(self.process.pid).children())

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group we made: the server and its workers
            self.process.wait(30)


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


def http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_for(service: Service, path: str, status: int) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        assert service.process.poll() is None, service.log()
        try:
            if http("GET", service.url(path), timeout=5)[0] == status:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{path} never answered {status}:\n{service.log()[-4000:]}")


def gunicorn(*extra: str) -> list[str]:
    return [str(BIN / "gunicorn"), "-k", "uvicorn_worker.UvicornWorker", "-w", str(WORKERS), "-b", "127.0.0.1:PORT",
            "--graceful-timeout", "10", "--no-control-socket", *extra]  # its default path is one per user


def applied_keys(db: Path, prefix: str) -> dict[str, str]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT key, outcome FROM applied_requests WHERE key LIKE ?", (prefix + "%",))
        return dict(rows.fetchall())


@pytest.mark.parametrize("preload", [False, True], ids=["forked-workers", "preload"])
def test_every_gunicorn_worker_serves_with_a_client_made_in_its_lifespan(
        cluster: LocalCluster, tmp_path: Path, services: list[Service], preload: bool) -> None:
    run = uuid.uuid4().hex
    service = Service(gunicorn(*(["--preload"] if preload else []), "tests.integration.web.wallet_apps:app"),
                      tmp_path, cluster, WALLET_RUN=run)
    services.append(service)
    wait_for(service, "/ready", 200)
    mine = f"worker-{run}-"
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while len(applied_keys(service.db, mine)) < WORKERS and time.monotonic() < deadline:
        time.sleep(0.2)  # each worker, once caught up, commits a deposit keyed by its pid
    workers = service.workers()
    assert sorted(int(k.removeprefix(mine)) for k in applied_keys(service.db, mine)) == workers, \
        service.log()[-4000:]
    assert len(workers) == WORKERS
    # and the service does what it is for, whichever worker answers
    wallet = f"alice-{run}"  # the log outlives each test's service: a wallet of its own
    assert http("POST", service.url(f"/wallets/{wallet}/deposit"), {"amount": 5, "key": run})[0] == 200
    assert http("POST", service.url(f"/wallets/{wallet}/withdraw"), {"amount": 9, "key": run + "w"})[0] == 409
    assert "ForkedClientError" not in service.log() and "Traceback" not in service.log(), service.log()[-4000:]


def test_a_client_opened_in_a_preload_master_fails_every_worker_at_once_with_the_fork_error(
        cluster: LocalCluster, tmp_path: Path, services: list[Service]) -> None:
    service = Service(gunicorn("--preload", "tests.integration.web.wallet_preloaded:app"), tmp_path, cluster)
    services.append(service)
    try:
        code = service.process.wait(BOOT_TIMEOUT_S)  # no hang: the workers fail to boot, and the master gives up
    except subprocess.TimeoutExpired:
        raise AssertionError(f"gunicorn did not stop:\n{service.log()[-4000:]}") from None
    log = service.log()
    # gunicorn's "worker failed to boot" (3; 1 when a second worker's failure is reaped while it halts)
    assert code in (1, 3) and "Worker failed to boot" in log, log[-4000:]
    assert f"this client was created in process {service.process.pid} before a fork; create a client in each " \
           "worker after the fork (gunicorn: post_fork / lifespan)" in log, log[-4000:]
    assert "Segmentation fault" not in log and "SIGSEGV" not in log and "core dumped" not in log


def test_the_same_module_without_preload_opens_a_client_in_each_worker(
        cluster: LocalCluster, tmp_path: Path, services: list[Service]) -> None:
    service = Service(gunicorn("tests.integration.web.wallet_preloaded:app"), tmp_path, cluster)
    services.append(service)
    wait_for(service, "/health", 200)


def test_a_request_retried_after_a_timeout_or_a_cancel_commits_once_and_reads_see_it_on_every_worker(
        cluster: LocalCluster, tmp_path: Path, services: list[Service]) -> None:
    service = Service(gunicorn("tests.integration.web.wallet_apps:app"), tmp_path, cluster)
    services.append(service)
    wait_for(service, "/ready", 200)
    key = uuid.uuid4().hex
    bob = f"bob-{key}"
    deposit = (service.url(f"/wallets/{bob}/deposit"), {"amount": 7, "key": key})
    # the first try: the HTTP client gives up at once (a time-out); the request may go on in a worker
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        http("POST", *deposit, timeout=0.001)
    # the retries, some at the same time (in flight together: the key's lock lets one commit)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: http("POST", *deposit), range(4)))
    answers.append(http("POST", *deposit))
    assert {status for status, _ in answers} == {200}, answers
    ids = {body["transaction_id"] for _, body in answers}
    assert len(ids) == 1, answers  # every retry names the one transaction that committed
    assert {body["status"] for _, body in answers} <= {"ok", "duplicate"}
    assert applied_keys(service.db, key) == {key: "ok"}
    # read-your-writes: whichever worker answers waits until it has applied the transaction
    (committed,) = ids
    for _ in range(WORKERS * 2):
        status, body = http("GET", service.url(f"/wallets/{bob}?after={committed}"))
        assert (status, body["balance"]) == (200, 7), body
    status, body = http("GET", service.url(f"/wallets/{bob}?after={committed + 10**6}"), timeout=60)
    assert status == 504 and "is not applied here yet" in body["detail"], body


class Backlog(TransactionContext):
    """A deposit in the wallet service's format, written straight to the log."""

    def __init__(self, index: int) -> None:
        self.index = index

    def partition_id(self, num_partitions: int) -> int:
        return self.index % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(HEADER)
        builder.set_data(json.dumps({"op": "deposit", "wallet": f"w{self.index % 50}", "amount": 1,
                                     "key": f"backlog-{self.index}"}).encode())
        return True


def write_backlog(cluster: LocalCluster, count: int) -> None:
    from tests.component.client.helpers import MemoryCallbacks

    async def main() -> None:
        async with AsyncWaltzClient(MemoryCallbacks(), {"client.servers": cluster.servers[0].address,
                                                        "client.mountTimeout": 60}) as writer:
            futures = [await writer.submit(Backlog(i)) for i in range(count)]
            assert all(await asyncio.gather(*futures))

    asyncio.run(main())


def test_sigterm_during_a_long_catch_up_stops_the_service_promptly_after_it_reported_not_ready(
        cluster: LocalCluster, tmp_path: Path, services: list[Service]) -> None:
    backlog = 3000
    write_backlog(cluster, backlog)
    # 10 ms per transaction: a catch-up of 30 s and more, and an apply batch (server.feedBatchSize 50) of 0.5 s
    service = Service([str(BIN / "uvicorn"), "--port", "PORT", "tests.integration.web.wallet_apps:app"], tmp_path,
                      cluster, WALLET_APPLY_DELAY="0.01")
    services.append(service)
    wait_for(service, "/ready", 503)  # up, and saying it is catching up
    assert http("GET", service.url("/health"))[0] == 200
    sent = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    try:
        code = service.process.wait(20)  # the catch-up had 30 s and more to go
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 20 s after SIGTERM:\n{service.log()[-4000:]}") from None
    print(f"exited {time.monotonic() - sent:.1f} s after SIGTERM, {len(applied_keys(service.db, 'backlog-'))} of "
          f"{backlog} applied")
    assert code in (0, -signal.SIGTERM), service.log()[-4000:]  # uvicorn raises the signal again once shut down
    assert len(applied_keys(service.db, "backlog-")) < backlog  # it stopped mid-catch-up, not after it
    assert "Application shutdown complete" in service.log(), service.log()[-4000:]


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_children_of_a_process_that_had_a_client_are_refused_a_new_one_at_once_instead_of_hanging(
        cluster: LocalCluster, mode: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.integration.web.fork_children", cluster.servers[0].address,
                           mode], cwd=ROOT, capture_output=True, text=True, timeout=BOOT_TIMEOUT_S, check=False)
    assert done.returncode == 0 and "children: [0, 0]" in done.stdout, done.stdout + done.stderr[-4000:]
