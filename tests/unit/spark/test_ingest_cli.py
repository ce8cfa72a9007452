"""The ingest command line, decoder loading and one-line errors (no Spark, no cluster)."""

import pytest

from waltz_spark import ingest
from waltz_spark.decoders import json_columns, load_decoder, raw

ARGS = ["--zookeeper", "127.0.0.1:1", "--root", "/w", "--output", "/tmp/out"]


def test_source_options_from_the_command_line():
    caps = ["--max-records-per-partition", "100", "--max-records-per-trigger", "150", "--max-bytes-per-trigger", "9000"]
    args = ingest.parse_args([*ARGS, "--partitions", "0-2", *caps, "--timeout", "5"])
    assert ingest.source_options(args) == {
        "startingOffsets": "earliest",
        "zookeeper": "127.0.0.1:1",
        "root": "/w",
        "partitions": "0-2",
        "maxRecordsPerPartition": "100",
        "maxRecordsPerTrigger": "150",
        "maxBytesPerTrigger": "9000",
        "timeoutSeconds": "5",
    }


def test_servers_replace_zookeeper_and_root(capsys):
    args = ingest.parse_args(["--servers", "h:7,h:8", "--output", "/tmp/out"])
    assert ingest.source_options(args) == {"startingOffsets": "earliest", "servers": "h:7,h:8", "timeoutSeconds": "30"}
    with pytest.raises(SystemExit):
        ingest.parse_args(["--output", "/tmp/out"])
    assert "give --servers, or --zookeeper and --root" in capsys.readouterr().err


def test_decoders_load_by_name_with_clear_errors():
    assert load_decoder("waltz_spark.decoders:json_columns") is json_columns
    assert load_decoder("waltz_spark.decoders:raw") is raw
    with pytest.raises(ValueError, match="module:function"):
        load_decoder("json_columns")
    with pytest.raises(ValueError, match="cannot import"):
        load_decoder("no_such_module_here:f")
    with pytest.raises(ValueError, match="has no function"):
        load_decoder("waltz_spark.decoders:nothing")
    with pytest.raises(ValueError, match="schema"):
        json_columns(None, {})


def test_one_line_finds_the_waltz_error_in_a_spark_trace():
    trace = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted\n"
        'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "waltz_spark.reading.ChecksumMismatch: checksum mismatch in partition 1 transaction 5: data CRC-32 0x1\n"
        "\tat org.apache.spark.Something(X.scala:1)\n"
    )
    assert ingest.one_line(RuntimeError(trace)) == (
        "ChecksumMismatch: checksum mismatch in partition 1 transaction 5: data CRC-32 0x1"
    )
    assert ingest.one_line(RuntimeError("\nplain trouble\nmore")) == "plain trouble"


def test_an_unreachable_zookeeper_is_one_line_and_exit_1(capsys):
    assert ingest.main([*ARGS, "--timeout", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "waltz-ingest: cannot reach ZooKeeper at 127.0.0.1:1 within 1 s: Connection time-out"


def test_bad_pairs_are_refused(capsys):
    assert ingest.main([*ARGS, "--conf", "novalue"]) == 1
    assert capsys.readouterr().err == "waltz-ingest: --conf must be KEY=VALUE, not 'novalue'\n"
