"""`waltz client ...`: high-water marks, tailing committed transactions, and the lock validation workload."""

from __future__ import annotations

import argparse
import base64
import sys
import time
from typing import Any

from waltz.v1 import common_pb2, server_pb2
from waltz_cli import rpc, validate
from waltz_cli.context import Context
from waltz_cli.errors import EXIT_FAILED, CliError, UsageError, one_line
from waltz_cli.output import Result, data_text, emit_line, table


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the client subcommands."""
    parser = groups.add_parser("client", help="read and exercise partitions as a client", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    hwm = sub.add_parser("high-water-mark", help="partitions' committed high-water marks", parents=[common])
    hwm.add_argument("-p", "--partitions", metavar="RANGES", help="partitions, e.g. 0-6,8 (default: all)")
    hwm.set_defaults(func=high_water_mark_cmd)
    tail = sub.add_parser("tail", help="print committed transactions of a partition", parents=[common])
    tail.add_argument("-p", "--partition", type=int, required=True, help="the partition")
    tail.add_argument("--from", dest="start", type=int, help="first transaction id (default: the last --count)")
    tail.add_argument("-n", "--count", type=int,
                      help=f"how many: the last N, or N from --from (default: {DEFAULT_TAIL}; with --from: all)")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new transactions until Ctrl-C")
    tail.add_argument("--interval", type=float, default=0.5, help="seconds between polls with --follow")
    tail.set_defaults(func=tail_cmd)
    validate.register(sub, common)


def high_water_mark_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Print each partition's high-water mark; a partition that cannot answer (not ready, no owner) is reported on
    stderr and printed as '-' (null in --json), the others still printed; exit 1 if any failed."""
    marks: dict[int, int | None] = {}
    for pid in ctx.partitions(args.partitions):
        try:
            marks[pid] = rpc.high_water_mark(ctx, pid)
        except CliError as exc:
            marks[pid] = None
            print(f"waltz: error: partition {pid}: {one_line(exc)}", file=sys.stderr, flush=True)
    failed = [pid for pid, mark in marks.items() if mark is None]
    return Result(
        {str(p): m for p, m in marks.items()},
        table(["partition", "high-water mark"], sorted(marks.items())),
        EXIT_FAILED if failed else 0,
    )


def record_data(record: common_pb2.Record) -> dict[str, Any]:
    """A committed record as plain data (data in base64)."""
    r = record.req_id
    return {
        "transaction_id": record.transaction_id,
        "req_id": {
            "client_id": r.client_id,
            "generation": r.generation,
            "partition_id": r.partition_id,
            "seq_num": r.seq_num,
        },
        "header": record.header,
        "data_length": len(record.data),
        "checksum": record.checksum,
        "data_base64": base64.b64encode(record.data).decode("ascii"),
    }


def record_line(record: common_pb2.Record) -> str:
    """A committed record on one line for people."""
    r = record.req_id
    return (
        f"{record.transaction_id:>8}  client {r.client_id} gen {r.generation} seq {r.seq_num}  header {record.header}  "
        f"{len(record.data)} bytes  {data_text(record.data, 60)}"
    )


READ_CHUNK = 5000  # transactions per ReadTransactions call, so each call ends well within its deadline


def read_range(ctx: Context, pid: int, first: int, last: int, as_json: bool) -> int:
    """Print transactions first..last of a partition as they stream in; returns how many."""
    target = rpc.owner_address(ctx, pid)

    def stream(start: int, end: int) -> int:
        n = 0
        request = server_pb2.ReadTransactionsRequest(partition_id=pid, from_transaction_id=start, to_transaction_id=end)
        with rpc.server_stub(ctx, target) as stub:
            for reply in stub.ReadTransactions(request, timeout=max(ctx.rpc_timeout_s, 60.0)):
                for record in reply.records:
                    emit_line({"partition": pid, **record_data(record)}, record_line(record), as_json)
                    n += 1
        return n

    printed = 0
    for start in range(first, last + 1, READ_CHUNK):
        printed += rpc.call(f"server {target} (partition {pid})", stream, start, min(last, start + READ_CHUNK - 1))
    return printed


DEFAULT_TAIL = 10


def tail_range(start: int | None, count: int | None, high_water_mark: int) -> tuple[int, int | None]:
    """(first id, last id or None for "up to the high-water mark, and on with --follow") that `client tail` prints:
    --from alone: from there on; -n alone: the last n; both: exactly n from --from (fewer if the log is shorter)."""
    if start is None:
        return max(0, high_water_mark - (count or DEFAULT_TAIL) + 1), None
    return start, None if count is None else start + count - 1


def tail_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Print committed transactions; with --follow, keep going."""
    pid = ctx.partitions(str(args.partition))[0]
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    if args.start is not None and args.start < 0:
        raise UsageError("--from must be 0 or more")
    if args.start is not None and args.count is not None and args.follow:
        raise UsageError("--from with --count prints a fixed range and --follow never stops: drop one of them")
    hwm = rpc.high_water_mark(ctx, pid)
    next_id, last = tail_range(args.start, args.count, hwm)
    printed = 0
    while True:
        upto = hwm if last is None else min(hwm, last)
        if next_id <= upto:
            printed += read_range(ctx, pid, next_id, upto, ctx.as_json)
            next_id = upto + 1
        if not args.follow:
            break
        time.sleep(args.interval)
        hwm = rpc.high_water_mark(ctx, pid)
    return Result(None, "" if printed or ctx.as_json else f"partition {pid} has no transactions from {next_id}")
