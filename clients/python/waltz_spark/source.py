"""The `waltz` Spark Python Data Source: batch and streaming reads of a Waltz cluster's committed log."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from waltz_spark.options import SourceOptions, parse_options
from waltz_spark.planning import (
    RecordSizes,
    admit,
    admit_bytes,
    check_not_behind,
    end_positions,
    from_offset,
    plan_ranges,
    start_positions,
    to_offset,
)

SIZE_SAMPLE_AGE_S = 60.0
"""How old a partition's record size sample may grow before maxBytesPerTrigger samples it again."""

SCHEMA = StructType(
    [
        StructField("partition", IntegerType()),
        StructField("transaction_id", LongType()),
        StructField("header", IntegerType()),
        StructField("client_id", IntegerType()),
        StructField("generation", IntegerType()),
        StructField("seq_num", IntegerType()),
        StructField("data", BinaryType()),
    ]
)


class WaltzDataSource(DataSource):
    """`spark.read.format("waltz")` / `spark.readStream.format("waltz")` with option servers (or zookeeper and root)."""

    @classmethod
    def name(cls) -> str:
        return "waltz"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return WaltzBatchReader(_checked(self.options, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WaltzStreamReader(_checked(self.options, schema))


def _checked(options: Mapping[str, str], schema: StructType) -> SourceOptions:
    if schema != SCHEMA:
        raise ValueError(f"the waltz source has a fixed schema ({SCHEMA.simpleString()}); do not pass another")
    return parse_options(options)


def _input_partitions(
    options: SourceOptions, start: Mapping[int, int], end: Mapping[int, int], owners: Mapping[int, str]
) -> list[InputPartition]:
    """One InputPartition per partition with something to read, cut into pieces of recordsPerTask."""
    from waltz_spark.reading import ReadTask

    return [
        InputPartition(
            ReadTask(
                zookeeper=options.zookeeper,
                root=options.root,
                partition=r.partition,
                first=r.first,
                last=r.last,
                address=owners.get(r.partition, ""),
                batch_size=options.batch_size,
                timeout_s=options.timeout_s,
                tls=options.tls,
                zookeeper_security=options.zookeeper_security,
                servers=options.servers,
                streams=options.read_streams,
            )
        )
        for r in plan_ranges(start, end, options.records_per_task)
    ]


def _read(partition: InputPartition) -> Iterator[Any]:
    from waltz_spark.reading import read_task

    if partition.value is None:  # Spark's stand-in when a batch read plans no partition
        return iter(())
    return read_task(partition.value)


class WaltzBatchReader(DataSourceReader):
    """The transactions between startingOffsets and endingOffsets of the chosen partitions."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        from waltz_spark.cluster import ClusterDirectory
        from waltz_spark.options import OptionError

        options = self.options
        if options.starting == "latest":
            raise OptionError("startingOffsets 'latest' reads nothing in a batch query; use earliest or JSON")
        with ClusterDirectory(
            options.zookeeper, options.root, options.timeout_s, options.tls, options.zookeeper_security, options.servers
        ) as directory:
            pids = directory.select(options.partitions)
            hwms = directory.high_water_marks(pids)
            owners = directory.owners()
        start = start_positions(options.starting, pids, hwms)
        end = end_positions(options.ending, pids, hwms)
        return _input_partitions(options, start, end, owners)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)


class WaltzStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of newly committed transactions; offsets are {"p<pid>": last id read} (-1: none).

    Planning a micro-batch costs one GetHighWaterMark per partition, all in flight at once, to the owners the
    driver knows; ZooKeeper (or GetClusterInfo) is read once per query and again only after a failed call.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._directory: Any = None
        self._pids: list[int] | None = None
        self._target: dict[int, int] | None = None
        self._latest: dict[int, int] | None = None
        self._sizes = RecordSizes(SIZE_SAMPLE_AGE_S)

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the ZooKeeper session and channels stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def _cluster(self) -> Any:
        if self._directory is None:
            from waltz_spark.cluster import ClusterDirectory

            self._directory = ClusterDirectory(
                self.options.zookeeper,
                self.options.root,
                self.options.timeout_s,
                self.options.tls,
                self.options.zookeeper_security,
                self.options.servers,
            )
        return self._directory

    def _partitions(self) -> list[int]:
        if self._pids is None:
            self._pids = self._cluster().select(self.options.partitions)
        return self._pids

    def _high_water_marks(self) -> dict[int, int]:
        hwms: dict[int, int] = self._cluster().high_water_marks(self._partitions())
        self._latest = hwms
        return hwms

    def initialOffset(self) -> dict:
        pids = self._partitions()
        hwms = self._high_water_marks() if self.options.starting != "earliest" else {}
        return to_offset(start_positions(self.options.starting, pids, hwms))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_water_marks()

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self.options
        per_partition = options.max_records_per_partition
        rows = [
            cap
            for cap in (options.max_records_per_trigger, per_partition and per_partition * len(self._partitions()))
            if cap
        ]
        if rows:
            return ReadMaxRows(min(rows))
        if options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        pids = self._partitions()
        begin = from_offset(start, pids)
        available = self._target if self._target is not None else self._high_water_marks()
        check_not_behind(begin, available)
        if isinstance(limit, ReadAllAvailable):  # Trigger.Once: everything, whatever the options say
            return to_offset(admit(begin, available, None, None))
        options = self.options
        ends = admit(begin, available, options.max_records_per_partition, options.max_records_per_trigger)
        if options.max_bytes_per_trigger is not None:
            ends = admit_bytes(begin, ends, self._record_sizes(begin, ends), options.max_bytes_per_trigger)
        return to_offset(ends)

    def _record_sizes(self, begin: dict[int, int], ends: dict[int, int]) -> dict[int, float]:
        """Bytes per record of the partitions with something pending, sampled when never or long ago."""
        import time

        now = time.monotonic()
        for pid in self._sizes.stale([pid for pid in ends if ends[pid] > begin[pid]], now):
            last = (self._latest or ends)[pid]
            data_bytes, records = self._cluster().sample_sizes(pid, last, self.options.batch_size)
            self._sizes.learn(pid, data_bytes, records, now)
        return self._sizes.per_record()

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else to_offset(self._latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        pids = self._partitions()
        begin, finish = from_offset(start, pids), from_offset(end, pids)
        if begin == finish:
            return []
        return _input_partitions(self.options, begin, finish, self._cluster().known_owners())

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the committed log is immutable and kept by the cluster."""

    def stop(self) -> None:
        if self._directory is not None:
            self._directory.close()
            self._directory = None
