"""`waltz disk ...`: inspect a storage node's files offline (control file, segments); never writes."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from waltz_cli import diskread
from waltz_cli.context import Context
from waltz_cli.diskread import DiskError
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Result, data_text, progress, table
from waltz_common.cluster_admin import parse_partitions


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the disk subcommands (they need no ZooKeeper)."""
    parser = groups.add_parser("disk", help="read a storage node's files offline", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    ctl = sub.add_parser("dump-control", help="the control file: header and partition infos", parents=[common])
    ctl.add_argument("path", type=Path, help="waltz-storage.ctl or the storage directory")
    ctl.add_argument("-p", "--partitions", metavar="RANGES", help="only these partitions, e.g. 0-6,8")
    ctl.add_argument("-a", "--assigned", action="store_true", help="only partitions assigned to the node")
    ctl.set_defaults(func=dump_control_cmd)
    seg = sub.add_parser("dump-segment", help="a segment's header and records", parents=[common])
    seg.add_argument("path", type=Path, help="a .seg file")
    seg.add_argument("-t", "--transaction", type=int, help="start at this transaction id")
    seg.add_argument("-n", "--max", type=int, default=None, help="print at most this many records")
    seg.add_argument("-d", "--data", action="store_true", help="include the data (text, or hex)")
    seg.set_defaults(func=dump_segment_cmd)
    ver = sub.add_parser("verify-segment", help="check segments' records, checksums and index", parents=[common])
    ver.add_argument("paths", type=Path, nargs="+", help=".seg files, or directories to search for them")
    ver.set_defaults(func=verify_segment_cmd)


def _when(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


def _slot(info: Any) -> dict[str, int] | None:
    if info is None:
        return None
    return {
        "session_id": info.session_id,
        "low_water_mark": info.low_water_mark,
        "local_low_water_mark": info.local_low_water_mark,
    }


def dump_control_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Print the control file."""
    try:
        dump = diskread.read_control(args.path)
    except DiskError as exc:
        raise CliError(str(exc)) from None
    wanted = None
    if args.partitions:
        try:
            wanted = set(parse_partitions(args.partitions, dump.header.num_partitions))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    entries = [
        p for p in dump.partitions if (wanted is None or p.partition_id in wanted) and (not args.assigned or p.flags)
    ]
    h = dump.header
    data = {
        "path": str(dump.path),
        "version": h.version,
        "creation_time": _when(h.creation_time_ms),
        "cluster_key": str(h.cluster_key),
        "num_partitions": h.num_partitions,
        "problems": dump.problems,
        "partitions": [
            {
                "partition": p.partition_id,
                "slots": [_slot(s) for s in p.slots],
                "current_slot": p.current,
                "error": p.error,
                "assigned": p.flags is not None,
                "flags": p.flags,
            }
            for p in entries
        ],
    }
    rows = []
    for p in entries:
        cur = p.slots[p.current] if p.current is not None else None
        flags = p.flags or {}
        rows.append(
            [
                p.partition_id,
                p.flags is not None,
                flags.get("readable"),
                flags.get("writable"),
                cur.session_id if cur else None,
                cur.low_water_mark if cur else None,
                cur.local_low_water_mark if cur else None,
                p.current,
                "bad" if None in p.slots and not p.error else "ok" if not p.error else p.error,
            ]
        )
    head = (
        f"{dump.path}: format {h.version}, created {_when(h.creation_time_ms)}, cluster key {h.cluster_key}, "
        f"{h.num_partitions} partitions"
    )
    body = table(
        ["partition", "assigned", "readable", "writable", "session", "lwm", "local lwm", "slot", "checksums"], rows
    )
    problems = "".join(f"\nproblem: {p}" for p in dump.problems)
    return Result(data, f"{head}{problems}\n{body}", 1 if dump.problems else 0)


def dump_segment_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Print a segment's header and records (stops at the first damaged record and says so)."""
    if args.max is not None and args.max < 0:
        raise UsageError("--max must be 0 or more")
    records: list[dict[str, Any]] = []
    try:
        with diskread.mapped(args.path) as buf:
            report = diskread.open_segment(args.path, buf)
            if report.header is not None:
                for offset, r in diskread.iter_records(buf, report.first_transaction_id, report):
                    if args.transaction is not None and r.transaction_id < args.transaction:
                        continue
                    if args.max is not None and len(records) >= args.max:
                        continue
                    q = r.req_id
                    entry: dict[str, Any] = {
                        "transaction_id": r.transaction_id,
                        "offset": offset,
                        "client_id": q.client_id,
                        "generation": q.generation,
                        "partition_id": q.partition_id,
                        "seq_num": q.seq_num,
                        "header": r.header,
                        "data_length": len(r.data),
                        "checksum": r.checksum,
                    }
                    if args.data:
                        entry["data"] = data_text(r.data)
                    records.append(entry)
    except DiskError as exc:
        raise CliError(str(exc)) from None
    hd = report.header
    data = {
        "path": str(args.path),
        "header": None
        if hd is None
        else {
            "version": hd.version,
            "creation_time": _when(hd.creation_time_ms),
            "cluster_key": str(hd.cluster_key),
            "partition_id": hd.partition_id,
            "first_transaction_id": hd.first_transaction_id,
        },
        "records_in_file": report.records,
        "records": records,
        "problems": report.problems,
    }
    head = (
        f"{args.path}: no valid header"
        if hd is None
        else f"{args.path}: partition {hd.partition_id}, first transaction {hd.first_transaction_id}, "
        f"cluster key {hd.cluster_key}, created {_when(hd.creation_time_ms)}, {report.records} records"
    )
    cols = ["transaction_id", "offset", "client_id", "generation", "seq_num", "header", "data_length", "checksum"]
    cols += ["data"] if args.data else []
    body = table([c.replace("_", " ") for c in cols], [[r[c] for c in cols] for r in records])
    problems = "".join(f"\nproblem: {p}" for p in report.problems)
    return Result(data, f"{head}\n{body}{problems}", 1 if report.problems else 0)


def verify_segment_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Verify segments; exit 1 if any has a problem."""
    try:
        files = diskread.segment_files(args.paths)
        if not files:
            raise CliError(f"no .seg files under {', '.join(map(str, args.paths))}")
        reports = [diskread.verify_segment(f) for f in progress(files, len(files), "verify", ctx.show_progress)]
    except DiskError as exc:
        raise CliError(str(exc)) from None
    ok = all(not r.problems for r in reports)
    data = {
        "ok": ok,
        "segments": [
            {
                "path": str(r.path),
                "first_transaction_id": r.first_transaction_id,
                "records": r.records,
                "last_transaction_id": r.last_transaction_id,
                "index_entries": r.index_entries,
                "problems": r.problems,
            }
            for r in reports
        ],
    }
    rows = [
        [r.path, r.first_transaction_id, r.records, "ok" if not r.problems else "; ".join(r.problems)] for r in reports
    ]
    text = table(["segment", "first txn", "records", "state"], rows) + ("\nOK" if ok else "\nPROBLEMS FOUND")
    return Result(data, text, 0 if ok else 1)
