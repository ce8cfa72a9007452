"""`waltz storage replace | add-replica | drain | retire`: change where partitions' replicas live, under load,
without an acknowledged transaction ever resting on fewer than a majority of the replicas a recovery asks.

Each command drives every partition it concerns through the steps waltz_cli.replica_plan decides, observing
ZooKeeper (assignments, the store session's replica states), the storage nodes (which partitions they hold) and
each partition's owner (its write set) between steps, and printing each step and each wait on stderr. A refusal
found before any step is taken stops the command with nothing changed; every step is idempotent, so a command
stopped half-way (a timeout, Ctrl-C) goes on from where it was when run again.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from waltz.v1 import server_pb2
from waltz_cli import replica_plan, rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.guards import PartitionView, Refusal
from waltz_cli.output import Result, ranges, table
from waltz_cli.replica_plan import ReplicaFacts, Step
from waltz_common import cluster_admin

POLL_S = 0.5
PROGRESS_EVERY_S = 5.0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the replica lifecycle subcommands of `waltz storage`."""

    def command(name: str, func: Any, help_text: str, parts_required: bool) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, parents=[common])
        p.set_defaults(func=func)
        p.add_argument("-s", "--storage", required=True, metavar="HOST:PORT", help="the storage node")
        p.add_argument("-p", "--partitions", required=parts_required, metavar="RANGES", help="partitions, e.g. 0-6,8")
        p.add_argument("--step-timeout", type=float, default=600.0,
                       help="seconds to wait for each partition's next step to take effect (default 600)")
        return p

    command("replace", replace_cmd, "bring back a node whose disk was lost: out of the votes until it holds a full "
            "copy", False)
    command("add-replica", add_replica_cmd, "add replicas of partitions on a node, caught up into the write set", True)
    p = command("drain", drain_cmd, "move a node's replicas to other nodes, each new one caught up before the old "
                "one leaves", False)
    p.add_argument("--to", metavar="HOST:PORT,...", help="the nodes to move to (default: every other node)")
    p = command("retire", retire_cmd, "drain a node, then unregister it", False)
    p.add_argument("--to", metavar="HOST:PORT,...", help="the nodes to move to (default: every other node)")


@dataclass
class Job:
    """One partition's way through the steps: decide() gives the next (node, step) or a refusal."""

    partition_id: int
    decide: Callable[[PartitionView, Callable[[str], ReplicaFacts]], tuple[str, Step] | Refusal]
    done: bool = False
    awaiting: tuple[str, Step] | None = None
    waiting_since: float = 0.0
    last_said: float = 0.0
    steps: list[str] = field(default_factory=list)


class Driver:
    """Observes and acts for a set of jobs until all are done, one step of each at a time."""

    def __init__(self, ctx: Context, timeout_s: float) -> None:
        self.ctx = ctx
        self.timeout_s = timeout_s

    def say(self, text: str) -> None:
        print(f"waltz storage: {text}", file=sys.stderr, flush=True)

    def facts(self, pid: int, node: str) -> ReplicaFacts:
        with rpc.storage_admin(self.ctx, node) as admin:
            held = next((p for p in admin.list_partitions() if p.partition_id == pid and not p.error), None)
        return ReplicaFacts(holds=held is not None, in_write_set=node in self.write_set(pid),
                            max_transaction_id=held.max_transaction_id if held is not None else -1)

    def write_set(self, pid: int) -> frozenset[str]:
        """The owner's write set of the partition; empty while it has no owner or no open session."""
        try:
            target = rpc.owner_address(self.ctx, pid)
            reply = rpc.server_call(self.ctx, target, f"server {target}", "GetServerPartitions",
                                    server_pb2.ServerPartitionsRequest())
        except CliError:
            return frozenset()
        return frozenset(next((p.write_set for p in reply.partitions if p.partition_id == pid), ()))

    def run(self, jobs: list[Job]) -> None:
        first = True
        while not all(job.done for job in jobs):
            decisions = []
            for job in (j for j in jobs if not j.done):
                view = self.ctx.partition_view(job.partition_id)
                decision = job.decide(view, partial(self.facts, job.partition_id))
                if isinstance(decision, Refusal):
                    changed = "nothing was changed" if first else "the steps before this one were taken"
                    raise CliError(f"{decision.message(forceable=False)} ({changed})")
                decisions.append((job, decision))
            first = False
            for job, (node, step) in decisions:
                self.take(job, node, step)
            if not all(job.done for job in jobs):
                time.sleep(POLL_S)

    def take(self, job: Job, node: str, step: Step) -> None:
        pid, now = job.partition_id, time.monotonic()
        if step is Step.DONE:
            job.done = True
            self.say(f"partition {pid}: done")
            return
        if step in (Step.AWAIT_SESSION_WITHOUT, Step.AWAIT_WRITE_SET):
            if job.awaiting != (node, step):
                job.awaiting = (node, step)
                job.waiting_since = job.last_said = now
                self.say(f"partition {pid}: {self.waiting(pid, node, step)}")
            elif now - job.waiting_since > self.timeout_s:
                raise CliError(
                    f"partition {pid}: still {self.waiting(pid, node, step)} after {self.timeout_s:g} s; run the "
                    "same command again to go on from here (see `waltz server partitions` for the owner's state)"
                )
            elif now - job.last_said >= PROGRESS_EVERY_S:
                job.last_said = now
                self.say(f"partition {pid}: still {self.waiting(pid, node, step)} ({now - job.waiting_since:.0f} s)")
            return
        job.awaiting = None
        job.steps.append(f"{step.value} {node}")
        self.say(f"partition {pid}: {step.value} {node}")
        if step is Step.UNASSIGN:
            cluster_admin.unassign_partitions(self.ctx.zk, self.ctx.paths, node, [pid])
        elif step is Step.ASSIGN:
            cluster_admin.assign_partitions(self.ctx.zk, self.ctx.paths, node, [pid])
        elif step is Step.CREATE:
            with rpc.storage_admin(self.ctx, node) as admin:
                admin.assign(pid)

    def waiting(self, pid: int, node: str, step: Step) -> str:
        if step is Step.AWAIT_SESSION_WITHOUT:
            return f"waiting for a store session without {node} (ZooKeeper lists it in session " \
                   f"{self.ctx.partition_view(pid).session_id})"
        try:
            with rpc.storage_admin(self.ctx, node) as admin:
                held = next((p.max_transaction_id for p in admin.list_partitions() if p.partition_id == pid), None)
            behind = f"it holds up to transaction {held} of {rpc.high_water_mark(self.ctx, pid)}"
        except CliError as exc:
            behind = str(exc)
        return f"waiting for {node} to catch up into the write set ({behind})"


def _node_partitions(ctx: Context, node: str, text: str | None, voting_too: bool) -> list[int]:
    """The partitions ZooKeeper assigns node (and, with voting_too, lists it as a voting member of), within text."""
    wanted = set(ctx.partitions(text))
    found = set(cluster_admin.replica_assignments(ctx.zk, ctx.paths).get(node, []))
    if voting_too:
        found |= {pid for pid in range(ctx.num_partitions()) if ctx.partition_view(pid).is_voting_member(node)}
    return sorted(found & wanted)


def _check_node(ctx: Context, node: str) -> None:
    ctx.admin_port(node)  # a UsageError when the node is not registered
    with rpc.storage_admin(ctx, node) as admin:
        admin.list_partitions()  # reachable, or one CliError line saying why not


def _result(node: str, verb: str, jobs: list[Job], extra: str = "") -> Result:
    rows = [[job.partition_id, "; ".join(job.steps) or "nothing to do"] for job in jobs]
    data = {"node": node, "partitions": {str(job.partition_id): job.steps for job in jobs}}
    text = table(["partition", "steps taken"], rows) + f"\n{node}: {verb}" + extra
    return Result(data, text)


def replace_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """A node whose disk was lost: each of its partitions leaves the store session, then comes back as a new
    replica that votes only once it holds a full copy."""
    _check_node(ctx, args.storage)
    pids = _node_partitions(ctx, args.storage, args.partitions, voting_too=True)
    if not pids:
        raise UsageError(f"ZooKeeper neither assigns nor lists {args.storage} for partitions "
                         f"{args.partitions or 'any'}: nothing to replace")

    def decide(view: PartitionView, facts: Callable[[str], ReplicaFacts]) -> tuple[str, Step] | Refusal:
        step = replica_plan.replace_step(view, args.storage, facts(args.storage))
        return step if isinstance(step, Refusal) else (args.storage, step)

    jobs = [Job(pid, decide) for pid in pids]
    Driver(ctx, args.step_timeout).run(jobs)
    return _result(args.storage, f"replaced partitions {ranges(pids)}: each holds a full copy and is in the write "
                   "set; it votes from its partition's next store session", jobs)


def add_replica_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """New replicas of partitions on a node, each caught up into the write set."""
    _check_node(ctx, args.storage)
    pids = ctx.partitions(args.partitions)

    def decide(view: PartitionView, facts: Callable[[str], ReplicaFacts]) -> tuple[str, Step] | Refusal:
        step = replica_plan.add_step(view, args.storage, facts(args.storage))
        return step if isinstance(step, Refusal) else (args.storage, step)

    jobs = [Job(pid, decide) for pid in pids]
    Driver(ctx, args.step_timeout).run(jobs)
    return _result(args.storage, f"holds partitions {ranges(pids)}, in their write sets", jobs)


def _targets(ctx: Context, source: str, to: str | None) -> dict[str, tuple[int, int]]:
    nodes = cluster_admin.storage_nodes(ctx.zk, ctx.paths)
    if to is None:
        return {n: v for n, v in nodes.items() if n != source}
    named = [n.strip() for n in to.split(",") if n.strip()]
    unknown = [n for n in named if n not in nodes]
    if unknown or not named:
        raise UsageError(f"--to names nodes that are not in the cluster: {', '.join(unknown) or '(none)'}")
    return {n: nodes[n] for n in named if n != source}


def _drain(ctx: Context, args: argparse.Namespace) -> list[Job]:
    source = args.storage
    ctx.admin_port(source)
    pids = _node_partitions(ctx, source, args.partitions, voting_too=True)
    candidates = _targets(ctx, source, args.to)
    assignments = cluster_admin.replica_assignments(ctx.zk, ctx.paths)
    load = {node: len(held) for node, held in assignments.items()}
    group = cluster_admin.storage_nodes(ctx.zk, ctx.paths)[source][0]
    jobs = []
    for pid in pids:
        view = ctx.partition_view(pid)
        target = replica_plan.pick_target(pid, source, candidates, view.assigned, load, group)
        if isinstance(target, Refusal):
            raise CliError(f"{target.message(forceable=False)} (nothing was changed)")
        if source in view.assigned:
            load[target] = load.get(target, 0) + 1
        _check_node(ctx, target)

        def decide(view: PartitionView, facts: Callable[[str], ReplicaFacts],
                   target: str = target) -> tuple[str, Step] | Refusal:
            return replica_plan.move_step(view, source, target, facts(target))

        jobs.append(Job(pid, decide))
    Driver(ctx, args.step_timeout).run(jobs)
    return jobs


def drain_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Move a node's replicas elsewhere; its files stay on the node until deleted (remove-partition -d)."""
    jobs = _drain(ctx, args)
    moved = ranges([job.partition_id for job in jobs])
    return _result(args.storage, f"drained partitions {moved}: no store session counts on it for them; their "
                   "files are still on the node (waltz storage remove-partition -d deletes them)", jobs)


def retire_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Drain a node of every replica, then unregister it."""
    if args.partitions is not None:
        raise UsageError("retire moves every partition of the node: leave out -p (drain -p moves some)")
    jobs = _drain(ctx, args)
    left = _node_partitions(ctx, args.storage, None, voting_too=True)
    if left:
        raise CliError(f"{args.storage} is still assigned or voting for partitions {ranges(left)}: not unregistered")
    cluster_admin.remove_storage_node(ctx.zk, ctx.paths, args.storage)
    return _result(args.storage, "retired: unregistered from the cluster; stop its process and reclaim its disk",
                   jobs)
