"""The client against a real local cluster: ZooKeeper, 3 storage nodes and a server as processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks, eventually, run
from waltz_client import AsyncWaltzClient, PartitionLocalLock
from waltz_client.demo.bank import run_demo
from waltz_common.testing.zookeeper import ZooKeeperProcess

local_cluster = pytest.importorskip("waltz_common.testing.local_cluster")

FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 60, "client.requestTimeout": 60}
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = f"/test/{uuid.uuid4().hex[:12]}"
    workdir: Path = tmp_path_factory.mktemp("client-cluster")
    with local_cluster.LocalCluster(
        workdir, storage_nodes=3, servers=1, partitions=2, cluster_root=root, zookeeper=zookeeper.connect_string,
        # the last test kills the server: the restarted one gets its partitions back once the old session expired
        server_overrides={"zookeeper.sessionTimeoutSeconds": 6},
    ) as c:
        yield c


def test_commits_feed_other_clients_and_data_is_fetched_by_rpc(cluster: object) -> None:
    config = {**cluster.client_config(), **FAST}  # type: ignore[attr-defined]

    async def main() -> None:
        writer_cb, reader_cb = MemoryCallbacks(), MemoryCallbacks()
        async with AsyncWaltzClient(writer_cb, config) as writer, AsyncWaltzClient(reader_cb, config) as reader:
            await writer.wait_mounted()
            await reader.wait_mounted()
            base = {p: await writer.high_water_mark(p) for p in (0, 1)}
            futures = [await writer.submit(Ctx(b"t%d" % i, partition=i)) for i in range(20)]
            assert await asyncio.gather(*futures) == [True] * 20
            for p in (0, 1):
                assert await writer.high_water_mark(p) == base[p] + 10
            await eventually(lambda: all(reader.client_high_water_mark(p) == base[p] + 10 for p in (0, 1)), 30)
        for p in (0, 1):
            assert reader_cb.applied[p] == writer_cb.applied[p]  # the reader fetched data by RPC
        mine = {d for p in (0, 1) for _, d in writer_cb.applied[p] if d.startswith(b"t")}
        assert mine == {b"t%d" % i for i in range(20)}

    run(main())


def test_a_client_that_reads_other_clients_data_gets_it_inline_in_the_feed(cluster: object) -> None:
    """Issue 31: once the application read another client's data (a fetch), the client asks the feed for inline
    data (client.inlineDataMaxBytes) and applies the rest without fetching; a large transaction is still fetched."""
    config = {**cluster.client_config(), **FAST}  # type: ignore[attr-defined]

    async def main() -> None:
        writer_cb, reader_cb = MemoryCallbacks(), MemoryCallbacks()
        async with AsyncWaltzClient(writer_cb, config) as writer, AsyncWaltzClient(reader_cb, config) as reader:
            await writer.wait_mounted()
            await reader.wait_mounted()
            base = await writer.high_water_mark(0)
            before = (reader.stats.inline_data, reader.stats.fetched)  # after the catch-up of earlier tests' data
            for i in range(30):  # one at a time: one feed message each
                assert await (await writer.submit(Ctx(b"inline%d" % i, partition=0))) is True
            assert await (await writer.submit(Ctx(b"L" * 10_000, partition=0))) is True  # above the 4096 B default
            await eventually(lambda: reader.client_high_water_mark(0) == base + 31, 30)
            inline, fetched = reader.stats.inline_data - before[0], reader.stats.fetched - before[1]
        assert reader_cb.applied[0][-31:] == writer_cb.applied[0][-31:]
        assert inline >= 20 and 1 <= fetched <= 10, (inline, fetched)  # the large one is fetched

    run(main())


def test_closing_flushes_what_several_application_processes_have_in_flight(cluster: object, tmp_path: Path) -> None:
    """Issue 35: leaving `async with` with transactions in flight abandoned them, and the one submit_and_wait had
    given up on was logged as 'Future exception was never retrieved'. Three processes, each with 100 submitted and
    not awaited when it closes: every future ends True and nothing is reported."""
    config_file = tmp_path / "client.json"
    config_file.write_text(json.dumps({**cluster.client_config(), **FAST}))  # type: ignore[attr-defined]
    before = sum(cluster_high_water_marks(cluster).values())
    processes = [subprocess.Popen([sys.executable, "-m", "tests.integration.client.close_process", str(config_file),
                                   "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
                 for _ in range(3)]
    outputs = [process.communicate(timeout=240) for process in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert "never retrieved" not in err, err
        assert json.loads(out.splitlines()[-1]) == {"True": 100, "gave up waiting": 1}, out
    assert sum(cluster_high_water_marks(cluster).values()) == before + 3 * 101  # the given-up one committed too


def cluster_high_water_marks(cluster: object) -> dict[int, int]:
    config = {**cluster.client_config(), **FAST}  # type: ignore[attr-defined]

    async def read() -> dict[int, int]:
        async with AsyncWaltzClient(MemoryCallbacks(), {**config, "client.autoMount": False}) as c:
            return {p: await c.high_water_mark(p) for p in range(c.num_partitions)}

    result: dict[int, int] = run(read())
    return result


def test_a_lock_conflict_between_clients_is_retried_and_commits(cluster: object) -> None:
    config = {**cluster.client_config(), **FAST}  # type: ignore[attr-defined]
    lock = PartitionLocalLock("row", 7)

    async def main() -> None:
        async with AsyncWaltzClient(MemoryCallbacks(), config) as a, AsyncWaltzClient(MemoryCallbacks(), config) as b:
            await a.wait_mounted()
            await b.wait_mounted()
            contexts = [Ctx(b"%s%d" % (name, i), write=[lock]) for i in range(10) for name in (b"a", b"b")]
            futures = [await (a if i % 2 == 0 else b).submit(ctx) for i, ctx in enumerate(contexts)]
            assert await asyncio.gather(*futures) == [True] * 20
            for ctx in contexts:  # lock failures (likely here) were retried until each committed
                assert ctx.hooks[-2:] == [("completion", True), ("application",)]

    run(main())


def test_bank_demo_on_the_cluster(cluster: object) -> None:
    lines: list[str] = []
    report = run_demo(
        cluster.client_config(),
        num_clients=3,
        num_transactions=90,  # type: ignore[attr-defined]
        client_config=FAST,
        out=lines.append,
    )
    assert report.ok, (report.problems, lines)
    assert report.lowest_balance >= 0


def test_server_killed_mid_stream_nothing_lost_or_applied_twice(cluster: object) -> None:
    """Last in this module: it kills and restarts the cluster's server (kill -9)."""
    config = {**cluster.client_config(), **FAST}  # type: ignore[attr-defined]
    server = cluster.servers[0]  # type: ignore[attr-defined]

    async def main() -> None:
        callbacks = MemoryCallbacks()
        async with AsyncWaltzClient(callbacks, config) as c:
            await c.wait_mounted()
            contexts = [Ctx(b"k%d" % i, partition=i) for i in range(30)]
            futures = [await c.submit(ctx) for ctx in contexts[:10]]
            server.kill()
            later = asyncio.ensure_future(asyncio.gather(*[_submit(c, ctx) for ctx in contexts[10:]]))
            await asyncio.to_thread(server.start)
            futures += await later
            assert await asyncio.gather(*futures) == [True] * 30
            ends = {p: await c.high_water_mark(p) for p in (0, 1)}
            await eventually(lambda: all(c.client_high_water_mark(p) == ends[p] for p in (0, 1)), 30)
        applied = [d for p in (0, 1) for _, d in callbacks.applied[p]]
        for ctx in contexts:
            assert applied.count(ctx.data) == 1, ctx.data  # every one committed once, applied once
            assert ctx.hooks[-2:] == [("completion", True), ("application",)]

    run(main())


async def _submit(c: AsyncWaltzClient, ctx: Ctx) -> asyncio.Future[bool]:
    return await c.submit(ctx)
