"""Options, start/end positions, task ranges and admission control of the waltz source (no Spark, no I/O)."""

import pytest

from waltz_spark.options import OptionError, parse_options
from waltz_spark.planning import (
    NOTHING,
    ReadRange,
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


def test_rows_and_bytes_per_trigger_options():
    options = parse_options({**BASE, "maxRecordsPerTrigger": "1000", "MAXBYTESPERTRIGGER": "1048576"})
    assert (options.max_records_per_trigger, options.max_bytes_per_trigger) == (1000, 1_048_576)
    with pytest.raises(OptionError, match="maxBytesPerTrigger"):
        parse_options({**BASE, "maxBytesPerTrigger": "0"})


def test_admit_bytes_shares_bytes_evenly_by_each_partition_s_record_size():
    start = {0: 9, 1: NOTHING, 2: 4}
    ends = {0: 109, 1: 99, 2: 4}  # 100 pending, 100 pending, none
    sizes = {0: 68.0, 1: 468.0}  # rows of 100 B and 500 B with the 32 B of other columns
    assert admit_bytes(start, ends, sizes, 10_000) == {0: 9 + 50, 1: NOTHING + 10, 2: 4}
    # room for all: unchanged; the small partition's unused share goes to the big one
    assert admit_bytes(start, ends, sizes, 10**9) == ends
    assert admit_bytes({0: 98, 1: NOTHING}, {0: 99, 1: 99}, sizes, 10_000) == {0: 99, 1: NOTHING + 19}


def test_admit_bytes_lets_one_record_through_when_it_alone_is_over_the_cap():
    assert admit_bytes({0: 5, 1: 5}, {0: 9, 1: 9}, {0: 5000.0, 1: 3000.0}, 100) == {0: 5, 1: 6}
    assert admit_bytes({0: 5}, {0: 5}, {0: 5000.0}, 100) == {0: 5}  # nothing pending: nothing admitted
    assert admit_bytes({0: 5}, {0: 7}, {}, 32) == {0: 6}  # unsampled: only the fixed columns count


def test_record_sizes_are_sampled_once_and_again_when_old():
    sizes = RecordSizes(max_age_s=60.0)
    assert sizes.stale([0, 1], now=100.0) == [0, 1]
    sizes.learn(0, data_bytes=1600, records=16, now=100.0)
    sizes.learn(1, data_bytes=0, records=0, now=100.0)  # an empty sample teaches nothing
    assert sizes.per_record() == {0: 100.0}
    assert sizes.stale([0, 1], now=150.0) == [1]
    assert sizes.stale([0], now=160.5) == [0]


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
