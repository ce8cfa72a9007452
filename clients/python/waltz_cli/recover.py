"""`waltz storage recover-partition`: copy a partition from a healthy replica to a new or dirty one, then join it.

A destination that ZooKeeper lists as a voting member of the partition's store session is refused: its log
may hold acknowledged transactions the source lacks, and step 2 would cut them from the next vote.

Steps per partition (partition-rejoin-notes.txt: agree on the starting id, stream, then join):
1. mark the destination unwritable (offline requests are accepted only then);
2. the destination truncates its possibly dirty tail to its local low-water mark and proposes the next id;
   the source answers what it can serve from there: up to its low-water mark, or up to the partition's
   committed high-water mark when the source is a clean member of the current store session;
3. stream the records (admin RecordList from the source, offline Append on the destination);
4. set the destination's low-water mark, mark it writable again;
5. assign it in ZooKeeper, so servers start a new store session that includes it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from waltz.v1 import metadata_pb2
from waltz_cli import guards, rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Counter, Result, table
from waltz_cli.storage_session import StorageSession
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta


@dataclass(frozen=True)
class CopyPlan:
    """What to copy: transactions start..end (inclusive; none when end < start), then the low-water mark."""

    start: int
    end: int
    low_water_mark: int


def plan_copy(proposal: int, source_max: int, safe_end: int) -> CopyPlan:
    """Agree on the start: the destination proposes its next id; the source must hold everything before it."""
    if source_max < proposal - 1:
        raise CliError(
            f"the destination holds clean transactions up to {proposal - 1} but the source only up to {source_max}: "
            "choose a more advanced source"
        )
    end = min(source_max, safe_end)
    return CopyPlan(proposal, end, max(end, proposal - 1))


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `storage recover-partition`."""
    p = sub.add_parser("recover-partition", help="copy partitions from a healthy replica, then join", parents=[common])
    p.add_argument("-s", "--source", required=True, metavar="HOST:PORT", help="a healthy replica's storage node")
    p.add_argument("-d", "--destination", required=True, metavar="HOST:PORT", help="the new or dirty replica's node")
    p.add_argument("-p", "--partitions", required=True, metavar="RANGES", help="partitions, e.g. 0-6,8")
    p.add_argument("-b", "--batch-size", type=int, default=500, help="records per copy request (default 500)")
    p.set_defaults(func=recover_cmd)


def _status(admin: Any, pid: int) -> Any | None:
    return next((p for p in admin.list_partitions() if p.partition_id == pid), None)


def current_session(ctx: Context, pid: int) -> int:
    """The partition's current store session id in ZooKeeper (-1 when none)."""
    read = zkmeta.read(ctx.zk, ctx.paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)
    return read[0].session_id if read is not None else -1


def _committed_end(ctx: Context, pid: int, source: str, source_session: int, low_water_mark: int) -> int:
    """The last id the source holds committed: its low-water mark, or the partition's high-water mark when
    the source is a clean replica of the current store session (then its records up to it are committed)."""
    read = zkmeta.read(ctx.zk, ctx.paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)
    if read is None or read[0].session_id != source_session or source_session < 0:
        return low_water_mark
    states = {e.replica_id.storage_node_connect_string: e.replica_state for e in read[0].replica_states}
    state = states.get(source)
    if state is None or state.session_id != source_session or state.closing_high_water_mark != zkmeta.UNRESOLVED:
        return low_water_mark
    try:
        return max(low_water_mark, rpc.high_water_mark(ctx, pid))
    except CliError:
        return low_water_mark


def recover_one(ctx: Context, source: str, destination: str, pid: int, batch: int) -> dict[str, Any]:
    """Recover one partition onto destination; returns what was done."""
    params = ctx.store_params()
    with rpc.storage_admin(ctx, source) as src, rpc.storage_admin(ctx, destination) as dst:
        s = _status(src, pid)
        if s is None or s.error or not s.readable:
            why = "does not hold it" if s is None else (s.error or "it is unreadable")
            raise CliError(f"source {source} cannot serve partition {pid}: {why}")
        if _status(dst, pid) is None:
            dst.assign(pid)
        d = _status(dst, pid)
        if d is None or d.error:
            raise CliError(f"destination {destination}: partition {pid} is not usable: {d.error if d else 'missing'}")
        dst.set_writable(pid, False)
        try:
            session_id = max(d.session_id, s.session_id, current_session(ctx, pid))
            with StorageSession(
                destination, params.cluster_key, params.num_partitions, ctx.rpc_timeout_s, tls_files=ctx.tls
            ) as session:
                kept = session.truncate(pid, session_id, min(d.local_low_water_mark, d.max_transaction_id))
                safe_end = _committed_end(ctx, pid, source, s.session_id, s.low_water_mark)
                plan = plan_copy(kept + 1, s.max_transaction_id, safe_end)
                txn = plan.start
                with Counter(
                    plan.end - plan.start + 1 if plan.end >= plan.start else 0, f"partition {pid}", ctx.show_progress
                ) as bar:
                    while txn <= plan.end:
                        records = list(src.record_list(pid, txn, min(batch, plan.end - txn + 1)))
                        if not records:
                            raise CliError(
                                f"source {source} returned no records from transaction {txn} of partition {pid}"
                            )
                        session.append(pid, session_id, records)
                        txn += len(records)
                        bar.update(len(records))
                session.set_low_water_mark(pid, session_id, plan.low_water_mark)
        except CliError as exc:
            raise CliError(
                f"{exc}; partition {pid} on {destination} is left unwritable: fix the cause and run "
                "recover-partition again"
            ) from None
        dst.set_writable(pid, True)
        dst.set_readable(pid, True)
    cluster_admin.assign_partitions(ctx.zk, ctx.paths, destination, [pid])
    return {"partition": pid, "copied": max(0, plan.end - plan.start + 1), "session_id": session_id, **asdict(plan)}


def recover_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Recover each requested partition in turn."""
    if args.source == args.destination:
        raise UsageError("the source and the destination are the same node")
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    pids = ctx.partitions(args.partitions)
    for pid in pids:
        refusal = guards.recover_destination(ctx.partition_view(pid), args.destination)
        if refusal is not None:
            raise CliError(refusal.message(forceable=False))
    done = [recover_one(ctx, args.source, args.destination, pid, args.batch_size) for pid in pids]
    rows = [[d["partition"], d["start"], d["end"], d["copied"], d["low_water_mark"]] for d in done]
    text = table(["partition", "from", "to", "copied", "low-water mark"], rows)
    text += f"\n{args.destination} recovered from {args.source} and joined the replica set"
    return Result({"source": args.source, "destination": args.destination, "partitions": done}, text)
