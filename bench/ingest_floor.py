"""The floor of Spark's Python data source path: a data source whose reader does no work but hand Spark Arrow
batches of the rows the ceiling writes (bench.ingest_bench.in_memory_to_parquet's shape), so that the time left is
Spark's own: the Python worker sending Arrow to the JVM, the JVM turning it into rows, and the Parquet writer.

waltz-ingest and the batch reader go the same way (their reader's read() yields Arrow batches), so neither can be
faster than this row of bench.ingest_steady: where it sits below the ceiling, that gap is the path's, not Waltz's.
Spark's Python workers import this module by name (bench.ingest_bench.spark_session puts the repository on their
PYTHONPATH).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from waltz_spark.reading import ARROW_BATCH_ROWS, ARROW_SCHEMA
from waltz_spark.source import SCHEMA

NAME = "waltz_floor"


def template(partition: int, rows: int) -> pa.RecordBatch:
    """rows rows of partition as the ceiling makes them (data: JSON of about 90 B); ids from 0."""
    ids = np.arange(rows, dtype=np.int64)
    data = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * 64) for i in range(rows)]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(rows, partition, dtype=np.int32)),
            pa.array(ids),
            pa.array(np.zeros(rows, dtype=np.int32)),
            pa.array(np.ones(rows, dtype=np.int32)),
            pa.array(np.ones(rows, dtype=np.int32)),
            pa.array(ids.astype(np.int32)),
            pa.array(data, pa.binary()),
        ],
        schema=ARROW_SCHEMA,
    )


def batches(partition: int, rows: int, size: int = ARROW_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """rows rows in batches of size: one template, its transaction ids moved on per batch (no other work)."""
    base = template(partition, size)
    for first in range(0, rows, size):
        n = min(size, rows - first)
        batch = base.slice(0, n)
        ids = pa.array(np.arange(first, first + n, dtype=np.int64))
        yield batch.set_column(1, "transaction_id", ids)


class FloorReader(DataSourceReader):
    def __init__(self, rows: int, tasks: int) -> None:
        self.rows, self.tasks = rows, tasks

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in range(self.tasks)]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        p = partition.value
        return batches(p, self.rows // self.tasks + (1 if p < self.rows % self.tasks else 0))


class FloorStreamReader(DataSourceStreamReader):
    """The same rows as one stream: offset {"rows": N} once, the tasks as FloorReader's (what an availableNow query
    of waltz-ingest does over a filled log, with Spark's own costs per query and micro-batch and nothing else)."""

    def __init__(self, rows: int, tasks: int) -> None:
        self.rows, self.tasks = rows, tasks

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"rows": self.rows}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return FloorReader(end["rows"] - start["rows"], self.tasks).partitions()

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        return FloorReader(self.rows, self.tasks).read(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass


class FloorSource(DataSource):
    """Options: rows (in all), partitions (one task each)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        return SCHEMA

    def reader(self, schema: Any) -> FloorReader:
        return FloorReader(int(self.options["rows"]), int(self.options.get("partitions", "2")))

    def streamReader(self, schema: Any) -> FloorStreamReader:
        return FloorStreamReader(int(self.options["rows"]), int(self.options.get("partitions", "2")))


def floor_to_parquet(spark: Any, rows: int, partitions: int, out: str) -> None:
    """The floor's rows through the Python data source into partitioned Parquet, as the batch reader writes them."""
    df = spark.read.format(NAME).option("rows", str(rows)).option("partitions", str(partitions)).load()
    df.write.partitionBy("partition").parquet(out)


def floor_stream_to_parquet(spark: Any, rows: int, partitions: int, out: str) -> None:
    """The floor's rows as an availableNow streaming query into partitioned Parquet (checkpoint beside out), as
    waltz-ingest writes them: Spark's costs of a streaming query from its start to its end, and nothing of Waltz."""
    feed = spark.readStream.format(NAME).option("rows", str(rows)).option("partitions", str(partitions)).load()
    query = (
        feed.writeStream.format("parquet").option("path", out).option("checkpointLocation", out + "-checkpoint")
        .partitionBy("partition").trigger(availableNow=True).start()
    )
    query.awaitTermination()
