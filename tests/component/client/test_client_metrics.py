"""Client metrics in an application's registry: scraped during appends, a lost stream and remounts."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, eventually, run
from tests.integration.cli.observability import naming_problems, promtool, promtool_problems
from waltz_client import AsyncWaltzClient, MockServer, PartitionLocalLock, WaltzClient
from waltz_client.metrics import LatencyHistogram, ProcessValues


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and sorted labels."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scrape: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return scrape[(name, tuple(sorted(labels.items())))]


def check_exposition(registry: CollectorRegistry) -> None:
    text = generate_latest(registry).decode()
    assert naming_problems(text, "waltz_client_") == []
    if promtool() is not None:
        assert promtool_problems(text) == ""


@pytest.mark.skipif(promtool() is None, reason="promtool is missing: scripts/bootstrap installs it")
def test_scrapes_during_appends_lock_failures_and_remounts_are_promtool_clean() -> None:
    server = MockServer(2)
    registry = CollectorRegistry()
    scrapes: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

    async def main() -> None:
        async with AsyncWaltzClient(MemoryCallbacks(), FAST, driver=server, metrics_registry=registry) as c:
            await c.wait_mounted()
            server.hold_requests()  # appends stay pending: the scrape sees them
            futures = [await c.submit(Ctx(b"a%d" % i, partition=0)) for i in range(3)]
            await eventually(lambda: c.metric_partitions()[0].pending_appends == 3)
            held = await asyncio.to_thread(samples, registry)
            assert value(held, "waltz_client_partition_pending_appends", partition="0") == 3
            server.release_requests()
            assert await asyncio.gather(*futures) == [True] * 3
            server.force_next_lock_fail()
            futures = [await c.submit(Ctx(b"l", partition=1, write=[PartitionLocalLock("x", 1)]))]
            scraper = threading.Thread(target=lambda: [scrapes.append(samples(registry)) for _ in range(20)])
            scraper.start()
            futures += [await c.submit(Ctx(b"b%d" % i, partition=i)) for i in range(40)]
            server.restart_partition(0)  # an unasked NOT_READY: partition 0 mounts again
            server.disconnect()  # the stream is cut: a reconnect, and both partitions mount again
            futures += [await c.submit(Ctx(b"c%d" % i, partition=i)) for i in range(10)]
            assert all(await asyncio.gather(*futures))
            await asyncio.to_thread(scraper.join, 30)
            await c.flush()
            await eventually(lambda: all(c.client_high_water_mark(p) == server.high_water_mark(p) for p in (0, 1)))
            check_exposition(registry)
            end = samples(registry)
            for p in ("0", "1"):
                hwm = server.high_water_mark(int(p))
                assert value(end, "waltz_client_partition_mounted", partition=p) == 1
                assert value(end, "waltz_client_partition_client_high_water_mark", partition=p) == hwm
                assert value(end, "waltz_client_partition_server_high_water_mark", partition=p) == hwm
                assert value(end, "waltz_client_partition_lag_transactions", partition=p) == 0
                assert value(end, "waltz_client_partition_pending_appends", partition=p) == 0
                assert value(end, "waltz_client_remounts_total", partition=p) >= 1
            assert value(end, "waltz_client_reconnects_total") >= 1
            assert value(end, "waltz_client_commits_total") == 54 == c.stats.committed
            assert value(end, "waltz_client_applied_transactions_total") == 54
            assert value(end, "waltz_client_lock_failures_total") == 1
            assert value(end, "waltz_client_retries_total") == c.stats.retries >= 1
            assert value(end, "waltz_client_failed_appends_total") == c.stats.failed_appends >= 1
            assert value(end, "waltz_client_failed_transactions_total") == 0
            assert value(end, "waltz_client_append_latency_seconds_count") == 54
            assert value(end, "waltz_client_append_latency_seconds_bucket", le="+Inf") == 54
            assert 0 < value(end, "waltz_client_append_latency_seconds_sum") < 54 * 10
        assert not any(name.startswith("waltz_client_") for name, _ in samples(registry))  # unregistered by close

    run(main())
    commits = [value(s, "waltz_client_commits_total") for s in scrapes]
    assert commits == sorted(commits), "a counter went down between scrapes"


def test_metrics_are_off_by_default_and_one_client_per_registry() -> None:
    server = MockServer(1)
    before = set(REGISTRY._names_to_collectors)
    registry = CollectorRegistry()
    with WaltzClient(MemoryCallbacks(), FAST, driver=server) as plain:
        assert plain.submit(Ctx(b"x")).result(timeout=30)
    assert set(REGISTRY._names_to_collectors) == before
    with (WaltzClient(MemoryCallbacks(), FAST, driver=server, metrics_registry=registry),
          pytest.raises(ValueError, match="Duplicated timeseries")):
        WaltzClient(MemoryCallbacks(), FAST, driver=server, metrics_registry=registry)
    with WaltzClient(MemoryCallbacks(), FAST, driver=MockServer(1), metrics_registry=registry) as again:  # free again
        again.wait_mounted()
        assert value(samples(registry), "waltz_client_partition_mounted", partition="0") == 1


def test_the_latency_histogram_counts_into_prometheus_buckets() -> None:
    histogram = LatencyHistogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.5):
        histogram.observe(seconds)
    assert histogram.cumulative() == ([("0.001", 2), ("0.01", 3), ("+Inf", 4)], pytest.approx(0.5035))


def multiprocess_samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape as a multi-process server's metrics endpoint answers it: every worker's files, combined."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    check_exposition(registry)
    return samples(registry)


@pytest.mark.callback_modes("thread")  # each client applies the other's transactions: a fetch, off the loop
def test_in_multiprocess_mode_counters_sum_across_processes_and_gauges_combine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers simulated in one process: prometheus_client's multiprocess values, each with its own process
    identifier (the files a gunicorn worker of that pid would write); tests/integration/client/test_web_workers.py
    runs real ones."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(ProcessValues, "interval", 0.05)
    server = MockServer(1)

    def worker(pid: int) -> tuple[WaltzClient, CollectorRegistry]:
        monkeypatch.setattr(prometheus_values, "ValueClass", prometheus_values.MultiProcessValue(lambda: pid))
        registry = CollectorRegistry()
        client = WaltzClient(MemoryCallbacks(), FAST, driver=server, metrics_registry=registry)
        client.wait_mounted()
        # a labelled value is made at its first write, with the ValueClass of then: this worker's, before the next
        client._client._metrics.write()  # type: ignore[union-attr]
        return client, registry

    (first, first_registry), (second, _) = worker(101), worker(102)
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # one client per registry, as without the mode
        WaltzClient(MemoryCallbacks(), FAST, driver=server, metrics_registry=first_registry)
    assert all(first.submit(Ctx(b"a%d" % i)).result(timeout=30) for i in range(3))
    assert all(second.submit(Ctx(b"b%d" % i)).result(timeout=30) for i in range(5))
    expected = {"waltz_client_commits_total": 8, "waltz_client_applied_transactions_total": 16,
                "waltz_client_append_latency_seconds_count": 8, "waltz_client_partition_mounted": 1,
                "waltz_client_partition_client_high_water_mark": 7, "waltz_client_partition_pending_appends": 0}

    def scraped() -> dict[str, float]:
        scrape = multiprocess_samples(tmp_path)
        return {name: value(scrape, name, **({"partition": "0"} if "partition_" in name else {}))
                for name in expected if any(n == name for n, _ in scrape)}

    deadline = time.monotonic() + 10
    while scraped() != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scraped() == expected
    assert value(multiprocess_samples(tmp_path), "waltz_client_append_latency_seconds_bucket", le="+Inf") == 8
    second.close()  # a worker that stopped: its counters stay in the sum; its live gauges go with mark_process_dead
    mark_process_dead(102, str(tmp_path))
    first.close()  # a closed client in a live worker: not mounted
    assert scraped()["waltz_client_partition_mounted"] == 0
    again, _ = worker(101)  # a client made again in the same worker goes on from the counters the first left
    assert again.submit(Ctx(b"c")).result(timeout=30)
    again.close()
    assert scraped()["waltz_client_commits_total"] == 9
