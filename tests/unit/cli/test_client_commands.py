"""`waltz client tail` and `waltz client high-water-mark` against a stand-in for the servers (issue 28): -n with
--from is honoured, and one partition that cannot answer does not hide the others."""

from __future__ import annotations

import json

import pytest

from tests.unit.cli.helpers import waltz
from waltz.v1 import common_pb2
from waltz_cli import client, rpc
from waltz_cli.client import tail_range
from waltz_cli.context import Context
from waltz_cli.errors import CliError

HWM = {0: 19, 1: 4, 2: 7}
NOT_READY = {1}


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Partitions 0..2 with HWM's marks; partition 1 answers NOT_READY. Returns the ranges read."""
    reads: list[tuple[int, int, int]] = []

    def high_water_mark(ctx: Context, pid: int) -> int:
        if pid in NOT_READY:
            raise CliError(f"server 127.0.0.1:1 (partition {pid}): FAILED_PRECONDITION: NOT_READY")
        return HWM[pid]

    def read_range(ctx: Context, pid: int, first: int, last: int, as_json: bool) -> int:
        reads.append((pid, first, last))
        for txn in range(first, last + 1):
            record = common_pb2.Record(transaction_id=txn, data=str(txn).encode())
            client.emit_line({"partition": pid, **client.record_data(record)}, client.record_line(record), as_json)
        return last - first + 1

    monkeypatch.setattr(rpc, "high_water_mark", high_water_mark)
    monkeypatch.setattr(client, "read_range", read_range)
    monkeypatch.setattr(Context, "num_partitions", lambda self: len(HWM))
    return reads


def cli(capsys, *argv: str):
    return waltz(capsys, "--zookeeper", "127.0.0.1:1", "--root", "/waltz/my_cluster", "--json", "client", *argv)


def ids(out: str) -> list[int]:
    return [json.loads(line)["transaction_id"] for line in out.splitlines()]


def test_tail_from_with_count_prints_exactly_that_many(capsys, servers):
    run = cli(capsys, "tail", "-p", "0", "--from", "5", "-n", "3")
    assert run.code == 0, run.err
    assert ids(run.out) == [5, 6, 7]


def test_tail_without_count_or_without_from_is_as_before(capsys, servers):
    assert ids(cli(capsys, "tail", "-p", "0", "--from", "15").out) == [15, 16, 17, 18, 19]
    assert ids(cli(capsys, "tail", "-p", "0", "-n", "3").out) == [17, 18, 19]
    assert ids(cli(capsys, "tail", "-p", "0").out) == list(range(10, 20))
    assert ids(cli(capsys, "tail", "-p", "0", "--from", "18", "-n", "5").out) == [18, 19]  # the log ends first


def test_tail_refuses_a_fixed_range_with_follow(capsys, servers):
    run = cli(capsys, "tail", "-p", "0", "--from", "5", "-n", "3", "--follow")
    assert run.code == 2 and "drop one of them" in run.err
    assert servers == []


def test_tail_range():
    assert tail_range(5, 3, 19) == (5, 7)
    assert tail_range(5, None, 19) == (5, None)
    assert tail_range(None, 3, 19) == (17, None)
    assert tail_range(None, None, 3) == (0, None)


def test_high_water_mark_reports_every_partition_and_fails_only_the_unready(capsys, servers):
    run = cli(capsys, "high-water-mark")
    assert run.code == 1
    assert json.loads(run.out) == {"0": 19, "1": None, "2": 7}
    assert run.err.splitlines() == ["waltz: error: partition 1: server 127.0.0.1:1 (partition 1): "
                                    "FAILED_PRECONDITION: NOT_READY"]
    table = waltz(capsys, "--zookeeper", "127.0.0.1:1", "--root", "/r", "client", "high-water-mark")
    assert table.code == 1 and table.out.split("\n")[2:5] == ["0          19", "1          -", "2          7"]
    ready = cli(capsys, "high-water-mark", "-p", "0,2")
    assert ready.code == 0 and json.loads(ready.out) == {"0": 19, "2": 7} and ready.err == ""
