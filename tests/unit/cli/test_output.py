"""Human tables, partition ranges, JSON rendering and one-line error messages."""

from __future__ import annotations

import json

import grpc
import pytest

from waltz_cli.errors import CliError, one_line, rpc_message
from waltz_cli.output import Result, data_text, ranges, table
from waltz_common.cluster_admin import parse_partitions


@pytest.mark.parametrize(
    ("ids", "text"),
    [([], "-"), ([3], "3"), ([0, 1, 2, 3, 5], "0-3,5"), ([0, 2, 4], "0,2,4"), ([7, 8, 10, 11, 12], "7-8,10-12")],
)
def test_ranges(ids, text):
    assert ranges(ids) == text


@pytest.mark.parametrize("text", ["0-6,8", "3", "0-1,5-9,12"])
def test_ranges_round_trip_with_the_parser(text):
    assert ranges(parse_partitions(text)) == text


def test_table_aligns_columns_and_formats_values():
    text = table(["node", "ok", "partitions", "lag"], [["a:1", True, [0, 1, 2, 5], None], ["bb:22", False, [], 3]])
    assert text.splitlines() == [
        "node   ok   partitions  lag",
        "-----  ---  ----------  ---",
        "a:1    yes  0-2,5       -",
        "bb:22  no   -           3",
    ]


def test_empty_table():
    assert table(["a"], []) == "(none)"


def test_result_renders_text_or_sorted_json():
    result = Result({"b": 1, "a": [1, 2]}, "people")
    assert result.render(False) == "people"
    assert json.loads(result.render(True)) == {"a": [1, 2], "b": 1}


class _Rpc(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_rpc_messages_name_the_target():
    assert rpc_message(_Rpc(grpc.StatusCode.UNAVAILABLE, "connect failed"), "server 1") == (
        "server 1: unreachable (connect failed)"
    )
    assert rpc_message(_Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "x"), "node a") == "node a: no answer in time"
    assert rpc_message(_Rpc(grpc.StatusCode.NOT_FOUND, "no txn"), "s") == "s: NOT_FOUND: no txn"


def test_one_line_squeezes_multi_line_messages():
    assert one_line(CliError("first\n  second")) == "first second"
    assert one_line(KeyError("k")) == "KeyError: 'k'"


@pytest.mark.parametrize(
    ("data", "limit", "text"),
    [
        (b"17", None, "17"),
        (b"", None, ""),
        (b"\x00\xff", None, "0x00ff"),
        (b"line\nbreak", None, "0x6c696e650a627265616b"),
        (b"abcdefghij", 6, "abc..."),
    ],
)
def test_data_text(data, limit, text):
    assert data_text(data, limit) == text
