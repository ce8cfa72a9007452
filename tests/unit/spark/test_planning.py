"""Options, start/end positions, task ranges and admission control of the waltz source (no Spark, no I/O)."""

import pytest

from waltz_spark.options import OptionError, parse_options
from waltz_spark.planning import (
    NOTHING,
    ReadRange,
    admit,
    check_not_behind,
    end_positions,
    from_offset,
    plan_ranges,
    start_positions,
    to_offset,
)

BASE = {"zookeeper": "127.0.0.1:2181", "root": "/waltz/c"}


def test_defaults_and_case_insensitive_keys():
    options = parse_options({**BASE, "STARTINGOFFSETS": '{"1": 5}', "maxrecordsperpartition": "10", "batchSize": "50"})
    assert options.starting == {1: 5}
    assert options.ending == "latest"
    assert (options.max_records_per_partition, options.batch_size, options.partitions) == (10, 50, None)
    assert parse_options(BASE).starting == "earliest"


def test_servers_replace_zookeeper_and_root():
    options = parse_options({"servers": "h1:7, h2:7"})
    assert options.servers == ("h1:7", "h2:7") and options.zookeeper == ""
    with pytest.raises(OptionError, match="option 'servers'"):
        parse_options({"servers": "h1"})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"zookeeper": ""}, "zookeeper"),
        ({"root": "waltz"}, "root"),
        ({"startingOffsets": "newest"}, "startingOffsets"),
        ({"startingOffsets": '{"a": 1}'}, "not a partition id"),
        ({"endingOffsets": '{"0": -3}'}, "transaction id >= 0"),
        ({"startingOffsets": "[1]"}, "JSON object"),
        ({"maxRecordsPerPartition": "0"}, "positive"),
        ({"batchSize": "lots"}, "positive"),
    ],
)
def test_bad_options_say_which(extra, message):
    with pytest.raises(OptionError, match=message):
        parse_options({**BASE, **extra})


def test_offsets_round_trip_and_missing_partitions_start_at_the_beginning():
    assert to_offset({1: 4, 0: -1}) == {"p0": -1, "p1": 4}
    assert from_offset({"p0": 3}, [0, 2]) == {0: 3, 2: NOTHING}


def test_start_positions():
    hwms = {0: 9, 1: -1}
    assert start_positions("earliest", [0, 1], hwms) == {0: -1, 1: -1}
    assert start_positions("latest", [0, 1], hwms) == {0: 9, 1: -1}
    assert start_positions({0: 4}, [0, 1], hwms) == {0: 3, 1: -1}  # JSON ids are the first to read
    assert start_positions({0: 10}, [0, 1], hwms) == {0: 9, 1: -1}  # just past the end is fine
    with pytest.raises(OptionError, match="beyond its high-water mark"):
        start_positions({0: 11}, [0, 1], hwms)
    with pytest.raises(OptionError, match="not read"):
        start_positions({5: 0}, [0, 1], hwms)


def test_end_positions():
    hwms = {0: 9, 1: 3}
    assert end_positions("latest", [0, 1], hwms) == {0: 9, 1: 3}
    assert end_positions({1: 2}, [0, 1], hwms) == {0: 9, 1: 2}
    with pytest.raises(OptionError, match="above its high-water mark"):
        end_positions({1: 4}, [0, 1], hwms)
    with pytest.raises(OptionError, match="earliest"):
        end_positions("earliest", [0, 1], hwms)


def test_plan_ranges_cuts_big_ranges_and_skips_empty_ones():
    assert plan_ranges({0: -1, 1: 4, 2: 7}, {0: 9, 1: 4, 2: 8}, 4) == [
        ReadRange(0, 0, 3),
        ReadRange(0, 4, 7),
        ReadRange(0, 8, 9),
        ReadRange(2, 8, 8),
    ]
    assert plan_ranges({0: 5}, {0: 5}, 10) == []


def test_admit_caps_per_partition_and_in_total():
    start, available = {0: -1, 1: 9, 2: 0}, {0: 99, 1: 10, 2: 50}
    assert admit(start, available, None, None) == available
    assert admit(start, available, 20, None) == {0: 19, 1: 10, 2: 20}
    capped = admit(start, available, None, 31)
    assert sum(capped[p] - start[p] for p in start) == 31
    assert capped[1] == 10  # the small partition gets all it has, the rest is shared evenly
    assert abs((capped[0] - start[0]) - (capped[2] - start[2])) <= 1
    assert admit(start, {0: -1, 1: 9, 2: 0}, 5, 5) == {0: -1, 1: 9, 2: 0}


def test_a_high_water_mark_below_the_checkpoint_is_an_error():
    check_not_behind({0: 5}, {0: 5})
    with pytest.raises(RuntimeError, match="same cluster"):
        check_not_behind({0: 5}, {0: 4})


def test_tls_options_are_all_or_nothing(tmp_path):
    base = {"zookeeper": "z:1", "root": "/w"}
    assert parse_options(base).tls is None
    with pytest.raises(OptionError, match=r"TLS needs all of tls\.certFile, tls\.keyFile, tls\.caFile"):
        parse_options({**base, "tls.certFile": "a.pem"})
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    given = {"TLS.CERTFILE": "c.pem", "tls.keyfile": "k.pem", "tls.caFile": "ca.pem"}
    parsed = parse_options({**base, **{k: str(tmp_path / v) for k, v in given.items()}})
    assert parsed.tls is not None and parsed.tls.cert_file == str(tmp_path / "c.pem")
    secured = parse_options({**base, "zookeeper.auth": "digest:reader:pw"}).zookeeper_security
    assert secured is not None and secured.auth == ("digest", "reader:pw")
    with pytest.raises(OptionError, match=r"zookeeper\.auth must look like scheme:credential"):
        parse_options({**base, "zookeeper.auth": "nocolon"})
