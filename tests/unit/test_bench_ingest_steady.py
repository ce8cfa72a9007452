"""bench.ingest_steady's pure part (bench.ingest_tables): the line fit, the freshness, the sink log's entries and
the micro-batches out of progress reports; and bench.ingest_stream's sink watcher on a hand-made sink."""

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.ingest_stream import ProcessCpu, SinkWatcher
from bench.ingest_tables import (
    Run,
    batches,
    fit_line,
    fit_table,
    freshness,
    metadata_files,
    metadata_paths,
    partition_of,
    rate_rows,
)


def test_fit_line_recovers_a_fixed_cost_and_a_cost_per_row() -> None:
    points = [(rows, 250 + 0.004 * rows) for rows in (1000, 1000, 10_000, 50_000)]
    line = fit_line(points)
    assert line.intercept == pytest.approx(250) and line.slope == pytest.approx(0.004) and line.points == 4


def test_fit_line_is_least_squares_through_noise() -> None:
    line = fit_line([(0, 1.0), (0, 3.0), (10, 12.0), (10, 10.0)])
    assert line.intercept == pytest.approx(2.0) and line.slope == pytest.approx(0.9)


def test_fit_line_refuses_a_single_size() -> None:
    with pytest.raises(ValueError, match="two sizes"):
        fit_line([(1000, 5.0), (1000, 6.0)])


def test_freshness_is_visible_minus_commit_over_the_committed_ones() -> None:
    commits = {(0, t): 100.0 + t for t in range(100)}
    visible = {(0, t): 100.0 + t + (0.5 if t < 99 else 3.0) for t in range(100)}
    visible[(1, 7)] = 0.0  # not one of the appenders': left out
    fresh = freshness(commits, visible)
    assert (fresh.landed, fresh.missing) == (100, 0)
    assert fresh.p50 == pytest.approx(0.5) and fresh.p99 == pytest.approx(3.0) and fresh.max == pytest.approx(3.0)


def test_freshness_counts_the_committed_not_landed_as_missing() -> None:
    fresh = freshness({(0, 1): 1.0, (0, 2): 2.0}, {(0, 1): 1.25})
    assert (fresh.landed, fresh.missing, fresh.max) == (1, 1, 0.25)
    assert math.isnan(freshness({(0, 1): 1.0}, {}).p50)


def test_metadata_files_by_batch_id_with_compact_files_and_without_temporary_ones() -> None:
    names = ["10", "9.compact", ".10.abc.tmp", "2", "8", "11.tmp"]
    assert metadata_files(names) == ["2", "8", "9.compact", "10"]


def test_metadata_paths_are_the_added_files() -> None:
    text = (
        'v1\n{"path":"file:///s/partition=0/a.parquet","size":1,"isDir":false,"action":"add"}\n'
        '{"path":"file:///s/partition=1/b.parquet","size":1,"isDir":false,"action":"delete"}\n'
    )
    assert metadata_paths(text) == ["file:///s/partition=0/a.parquet"]
    with pytest.raises(ValueError):
        metadata_paths('{"path": "x"}')


def test_partition_of_a_data_file() -> None:
    assert partition_of("file:///out/partition=12/part-0.parquet") == 12
    with pytest.raises(ValueError):
        partition_of("file:///out/partitions=1/part-0.parquet")


def test_batches_keep_those_with_rows_and_their_phases() -> None:
    progress = [
        {"numInputRows": 0, "durationMs": {"triggerExecution": 3, "latestOffset": 2}},
        {"numInputRows": 500, "durationMs": {"triggerExecution": 400, "addBatch": 300, "latestOffset": 20}},
    ]
    (only,) = batches(progress)
    assert only.rows == 500 and only.ms == 400
    assert only.phases["addBatch"] == 300 and only.phases["walCommit"] == 0


def test_tables_give_ratios_to_the_ceiling() -> None:
    text = rate_rows(1000, Run("ceiling", 1.0, 2.0, 0.0), [Run("stream", 4.0, 3.0, 0.5)])
    stream = next(line for line in text.splitlines() if line.startswith("stream"))
    assert stream.split()[1:] == ["4", "250", "0.25x", "300", "1.50x", "50"]
    line = fit_line([(1000, 300.0), (2000, 310.0)])  # 10 us per row: 100,000 rows/s
    assert "0.50x" in fit_table(line, {}, ceiling_rate=200_000)


def test_the_sink_watcher_stamps_each_transaction_once_when_its_batch_log_appears(tmp_path: Path) -> None:
    log = tmp_path / "_spark_metadata"
    log.mkdir()

    def data_file(partition: int, name: str, txns: list[int]) -> str:
        directory = tmp_path / f"partition={partition}"
        directory.mkdir(exist_ok=True)
        pq.write_table(pa.table({"transaction_id": pa.array(txns, pa.int64())}), directory / name)
        return f'{{"path":"file://{directory / name}","size":1,"isDir":false,"action":"add"}}'

    watcher = SinkWatcher(tmp_path, interval=1.0)
    watcher.poll()
    assert watcher.visible == {}
    first = data_file(0, "a.parquet", [0, 1])
    (log / "0").write_text(f"v1\n{first}\n")
    watcher.poll()
    stamp = watcher.visible[(0, 0)]
    assert watcher.visible == {(0, 0): stamp, (0, 1): stamp}
    (log / "1.compact").write_text(f"v1\n{first}\n{data_file(1, 'b.parquet', [0])}\n")
    watcher.poll()
    assert watcher.visible[(0, 0)] == stamp and (1, 0) in watcher.visible and len(watcher.visible) == 3


class CannedCpu(ProcessCpu):
    """ProcessCpu with the samples given: the accounting without processes."""

    def __init__(self, samples: list[dict[int, tuple[bool, float]]]) -> None:
        super().__init__([])
        self.samples = samples

    def sample(self) -> dict[int, tuple[bool, float]]:
        return self.samples.pop(0)


def test_process_cpu_splits_cluster_from_spark_and_counts_a_new_process_from_zero() -> None:
    before = {1: (False, 10.0), 2: (True, 5.0), 3: (False, 1.0)}
    after = {1: (False, 12.0), 2: (True, 5.5), 4: (False, 0.25)}  # 3 ended (lost), 4 started
    assert CannedCpu([before, after]).measure(lambda: "done") == ("done", 2.25, 0.5)


def test_floor_batches_are_the_ceilings_rows_in_order() -> None:
    from bench.ingest_floor import FloorReader, batches
    from waltz_spark.reading import ARROW_SCHEMA

    got = list(batches(1, 20_000, size=8192))
    assert [b.num_rows for b in got] == [8192, 8192, 3616]
    assert all(b.schema == ARROW_SCHEMA for b in got)
    table = pa.Table.from_batches(got)
    assert table.column("transaction_id").to_pylist() == list(range(20_000))
    assert set(table.column("partition").to_pylist()) == {1}
    assert table.column("data")[5].as_py() == b'{"n": 5, "pad": "' + b"x" * 64 + b'"}'
    reader = FloorReader(rows=10, tasks=3)
    shares = [sum(b.num_rows for b in reader.read(p)) for p in reader.partitions()]
    assert shares == [4, 3, 3]


def test_floor_stream_offers_every_row_once() -> None:
    from bench.ingest_floor import FloorStreamReader

    reader = FloorStreamReader(rows=10, tasks=3)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert (start, end) == ({"rows": 0}, {"rows": 10})
    rows = [sum(b.num_rows for b in reader.read(p)) for p in reader.partitions(start, end)]
    assert rows == [4, 3, 3]
