"""waltz-ingest: land a Waltz cluster's feed incrementally in Parquet, partitioned by Waltz partition."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from waltz_spark.cluster import ClusterDirectory
from waltz_spark.decoders import Decoder, load_decoder
from waltz_spark.options import parse_options

DEFAULT_MASTER = "local[*]"
CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"
"""A read task holds one Waltz partition, so its rows need no sort by `partition` before the Parquet sink writes
them: with one writer allowed, Spark writes them as they come (and sorts only a task with several partitions).
In paired runs of 1M rows the ingest went from 0.28-0.32 of Spark's own DataFrame -> Parquet rate to 0.41-0.46."""
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Mismatch|Unavailable|Range)): (.+)$")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="waltz-ingest",
        description="Land the committed transactions of a Waltz cluster in Parquet (partition=<N>/ directories), "
        "incrementally: each run continues where the checkpoint says the last one stopped.",
    )
    parser.add_argument("--servers", help="Waltz servers, host:port[,host:port...] (instead of --zookeeper and --root)")
    parser.add_argument("--zookeeper", help="ZooKeeper connect string, host:port[,host:port...]")
    parser.add_argument("--root", help="the cluster root znode, e.g. /waltz/my_cluster")
    parser.add_argument("--output", required=True, help="the Parquet directory (any Hadoop path Spark can write)")
    parser.add_argument("--checkpoint", help="the streaming checkpoint directory (default: OUTPUT/_checkpoint)")
    parser.add_argument("--partitions", help='the partitions to land, e.g. "0-3,5" (default: all)')
    parser.add_argument(
        "--starting-offsets",
        default="earliest",
        help='where a new checkpoint starts: earliest, latest or JSON {"<pid>": <first id>} (default: earliest)',
    )
    parser.add_argument("--max-records-per-partition", type=int, help="at most this many per partition per batch")
    parser.add_argument("--max-records-per-trigger", type=int, help="at most this many in all per batch")
    parser.add_argument(
        "--max-bytes-per-trigger", type=int, help="about this many bytes of data per batch (from sampled sizes)"
    )
    parser.add_argument("--batch-size", type=int, help="records per ReadTransactions message (default: the server's)")
    parser.add_argument("--records-per-task", type=int, help="a range longer than this is read by several tasks")
    parser.add_argument("--read-streams", type=int, help="ReadTransactions calls at once per task (default 1)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to retry an unavailable partition")
    parser.add_argument("--decoder", default="waltz_spark.decoders:raw", help="module:function decoding the data")
    parser.add_argument(
        "--decoder-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='an option for the decoder (repeatable), e.g. schema="id LONG, name STRING"',
    )
    parser.add_argument("--continuous", action="store_true", help="keep running with a processing-time trigger")
    parser.add_argument("--interval", default="10 seconds", help="the trigger interval with --continuous")
    parser.add_argument("--master", help=f"the Spark master (default: {DEFAULT_MASTER}, or spark-submit's)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    parser.add_argument("--spark-log-level", default="FATAL", help="Spark's log level once started (default: FATAL)")
    args = parser.parse_args(argv)
    if not args.servers and not (args.zookeeper and args.root):
        parser.error("give --servers, or --zookeeper and --root")
    return args


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} must be KEY=VALUE, not {item!r}")
        result[key.strip()] = value
    return result


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """The `waltz` data source options the command line asks for."""
    options = {"startingOffsets": args.starting_offsets}
    optional = {
        "servers": args.servers,
        "zookeeper": args.zookeeper,
        "root": args.root,
        "partitions": args.partitions,
        "maxRecordsPerPartition": args.max_records_per_partition,
        "maxRecordsPerTrigger": args.max_records_per_trigger,
        "maxBytesPerTrigger": args.max_bytes_per_trigger,
        "batchSize": args.batch_size,
        "recordsPerTask": args.records_per_task,
        "readStreams": args.read_streams,
        "timeoutSeconds": max(1, round(args.timeout)),
    }
    options.update({k: str(v) for k, v in optional.items() if v is not None})
    return options


@dataclass(frozen=True)
class Plan:
    """What a run will do, checked before Spark starts."""

    options: dict[str, str]
    partitions: list[int]
    decoder: Decoder
    decoder_options: dict[str, str]
    checkpoint: str


def preflight(args: argparse.Namespace) -> Plan:
    """Check options, ZooKeeper, the cluster, the partitions and the decoder; any problem is a ValueError-like."""
    options = source_options(args)
    parsed = parse_options(options)
    with ClusterDirectory(
        parsed.zookeeper, parsed.root, min(parsed.timeout_s, 10.0), parsed.tls, parsed.zookeeper_security,
        parsed.servers,
    ) as directory:
        partitions = directory.select(parsed.partitions)
    checkpoint = args.checkpoint or args.output.rstrip("/") + "/_checkpoint"
    decoder_options = _pairs(args.decoder_option, "--decoder-option")
    return Plan(options, partitions, load_decoder(args.decoder), decoder_options, checkpoint)


def spark_session(master: str | None, conf: dict[str, str]) -> Any:
    """A session on master; without one, spark-submit's master or else local[*] with this interpreter."""
    from pyspark.sql import SparkSession

    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        master = DEFAULT_MASTER
    if master is not None and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.appName("waltz-ingest")
        .config("spark.sql.streaming.numRecentProgressUpdates", 10000)
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master is not None:
        builder = builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def start_query(spark: Any, plan: Plan, args: argparse.Namespace) -> Any:
    """The streaming query from the waltz source through the decoder into partitioned Parquet."""
    from waltz_spark.source import WaltzDataSource

    spark.dataSource.register(WaltzDataSource)
    if spark.conf.get(CONCURRENT_WRITERS, "0") == "0":  # unless the caller chose otherwise
        spark.conf.set(CONCURRENT_WRITERS, "1")
    feed = spark.readStream.format("waltz").options(**plan.options).load()
    decoded = plan.decoder(feed, plan.decoder_options)
    writer = (
        decoded.writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", plan.checkpoint)
        .partitionBy("partition")
        .queryName("waltz_ingest")
    )
    writer = writer.trigger(processingTime=args.interval) if args.continuous else writer.trigger(availableNow=True)
    return writer.start()


def run(query: Any) -> None:
    """Wait for the query; SIGINT or SIGTERM stops it cleanly (between batches, the checkpoint stays exact)."""
    stopping = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while query.isActive and not stopping:
            query.awaitTermination(1)
        if stopping:
            query.stop()
        if query.exception() is not None:
            raise query.exception()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def summary(query: Any, args: argparse.Namespace) -> str:
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    batches = sum(1 for p in progress if p["numInputRows"])
    end = progress[-1]["sources"][0]["endOffset"] if progress else None
    return f"waltz-ingest: landed {rows} transactions in {batches} batch(es) to {args.output}; offsets now {end}"


def one_line(exc: BaseException) -> str:
    """The message a person can act on, out of a Spark or Py4J error with its traces."""
    text = str(exc)
    for line in text.splitlines():
        match = ERROR_LINE.match(line.strip())
        if match and ("waltz" in line or "Waltz" in line or match.group(1) in ("OptionError", "MetadataError")):
            return f"{match.group(1)}: {match.group(2)}"
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ingestion (or keep running with --continuous); 0 on success, 1 with one line on error."""
    args = parse_args(argv)
    try:
        conf = _pairs(args.conf, "--conf")
        plan = preflight(args)
    except Exception as exc:
        print(f"waltz-ingest: {one_line(exc)}", file=sys.stderr)
        return 1
    spark = None
    owned = False
    try:
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None  # in-process callers keep their session
        spark = spark_session(args.master, conf)
        spark.sparkContext.setLogLevel(args.spark_log_level)
        query = start_query(spark, plan, args)
        run(query)
        print(summary(query, args))
        return 0
    except Exception as exc:
        print(f"waltz-ingest: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None and owned:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
