"""The pure part of bench.round: the loads' results turned into rows, the median of each side's rounds, the ratio
to the baseline, the ratios to the floors and the tables. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

from bench.curves.common import table, verdict

Row = tuple[str, str]  # (load, what)
SIDES = ("baseline", "candidate")
LONE = "Python client, 1 in flight"
RAW_LONE = "raw client, 1 in flight"
ECHO_SERVER = "grpc.aio stream round: server CPU us"
ECHO_CLIENT = "grpc.aio stream round: client CPU us"
FDATASYNC = "fdatasync of a 512 B append: wall us"
TARGETS = {"server": 2.0, "storage": 1.0, "client": 2.0}  # issue 42's "Done when", x the grpc round
SERVER_SHAPE = "server I/O shape"
STORAGE_SHAPE = "storage I/O shape, pwrite + fdatasync"
SHAPE_MODES = {"Lone": "one task", "Pipelined": "reader + writer tasks"}  # bench.io_shape's ways to serve


def _process_order(name: str) -> tuple[int, str]:
    rank = {"server": 0, "storage": 1, "client": 2}
    return next((r for prefix, r in rank.items() if name.startswith(prefix)), 3), name


def cpu_rows(load: str, result: Mapping[str, Any], seconds: float) -> dict[Row, float]:
    """A closed load's result (committed, errors, cpu: CPU seconds by process over `seconds`): committed/s, then
    CPU us per committed append of each process (servers, storage nodes, the client) and of all of them."""
    committed = max(int(result["committed"]), 1)
    cpu = {name: s for name, s in result["cpu"].items() if name != "zookeeper"}
    rows: dict[Row, float] = {(load, "committed/s"): result["committed"] / seconds}
    for name in sorted(cpu, key=_process_order):
        rows[(load, f"{name} CPU us")] = cpu[name] / committed * 1e6
    rows[(load, "all processes CPU us")] = sum(cpu.values()) / committed * 1e6
    rows[(load, "errors")] = float(result["errors"])
    return rows


def open_rows(rate: int, result: Mapping[str, Any], seconds: float) -> dict[Row, float]:
    """An open loop's result: committed/s, latency percentiles in ms, errors, and appends per store batch when the
    result has the server's counts."""
    load = f"{rate:,}/s offered"
    rows = {
        (load, "committed/s"): result["committed"] / seconds,
        **{(load, f"{q} ms"): result[q] * 1e3 for q in ("p50", "p99", "p99.9")},
        (load, "errors"): float(result["errors"]),
    }
    if result.get("store_batches"):
        rows[(load, "appends/store batch")] = result["store_batch_appends"] / result["store_batches"]
    return rows


def floor_values(echo: Mapping[str, Any], session: Mapping[str, Mapping[str, float]] | None, fdatasync_us: float,
                 shapes: Mapping[str, float] | None = None) -> dict[str, float]:
    """One round's floors: the echo's CPU per round of either side of the stream, the framed storage round
    (bench.session_port's "append 1" of either revision's port), one fdatasync and the I/O shapes
    (shape_values)."""
    rounds = max(int(echo["rounds"]), 1)
    values = {ECHO_SERVER: echo["cpu"]["server"] / rounds * 1e6, ECHO_CLIENT: echo["cpu"]["client"] / rounds * 1e6}
    for side in SIDES if session is not None else ():
        assert session is not None
        values[f"framed storage round ({side}'s port): node CPU us"] = session[side]["append 1"]
        values[f"framed storage round ({side}'s port): wall us"] = session[side]["append 1, round trip"]
    values[FDATASYNC] = fdatasync_us
    return {**values, **(shapes or {})}


def _per_round(result: Mapping[str, Any], who: str) -> float:
    """us of CPU per round of `who` (the mean of the peers for "peer") in a bench.io_shape variant's result."""
    cpu = result["cpu"]
    spent = [v for k, v in cpu.items() if k.startswith("peer-")] if who == "peer" else [cpu[who]]
    return sum(spent) / len(spent) / max(int(result["rounds"]), 1) * 1e6


def _server_rows(prefix: str, shape: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    values = {}
    for variant, result in shape.items():
        mode, form = variant.split()
        peers, inflight = form.split("@")
        values[f"{prefix}, {peers} peer{'' if peers == '1' else 's'}, {inflight} in flight, "
               f"{SHAPE_MODES[mode]}: server CPU us"] = _per_round(result, "server")
    return values


def shape_values(shape: Mapping[str, Mapping[str, Any]], storage: Mapping[str, Mapping[str, Any]] | None
                 ) -> dict[str, float]:
    """The I/O shape floors (bench.io_shape.measure's results, variants named "MODE PEERS@INFLIGHT"): the shape
    server's CPU per round of each variant and a peer's (3 peers, 1 in flight, one task); with storage peers, the
    server's CPU per round of each variant (the round slower: the storage node's latency) and, of the first, a
    peer's CPU per round and the round's wall time."""
    values = _server_rows(SERVER_SHAPE, shape)
    if "Lone 3@1" in shape:
        values[f"{SERVER_SHAPE}, no disk: a peer's CPU us"] = _per_round(shape["Lone 3@1"], "peer")
    if storage:
        values.update(_server_rows(f"{SERVER_SHAPE} with storage peers", storage))
        first = next(iter(storage.values()))
        values[f"{STORAGE_SHAPE}: a peer's CPU us"] = _per_round(first, "peer")
        values[f"{STORAGE_SHAPE}: round wall us"] = first["seconds"] / max(int(first["rounds"]), 1) * 1e6
    return values


def shape_ratios(floors: Mapping[str, float]) -> dict[str, float]:
    """One round's I/O shape floors' CPU over the grpc.aio round's server CPU."""
    return {f"{name.removesuffix(' CPU us')} / grpc round's server": _ratio(value, floors[ECHO_SERVER])
            for name, value in floors.items() if name.startswith(("server I/O", "storage I/O"))
            and name.endswith("CPU us")}


def shape_target(name: str) -> float | None:
    """The issue's target that a shape ratio bounds from below: the server's at 1 in flight, the storage node's."""
    if name.startswith(SERVER_SHAPE) and "1 in flight" in name:
        return TARGETS["server"]
    if name.startswith(f"{STORAGE_SHAPE}: a peer's"):
        return TARGETS["storage"]
    return None


def medians(runs: Sequence[Mapping[Any, float]]) -> dict[Any, float]:
    """The median of each row present in every run, in the first run's order."""
    if not runs:
        return {}
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    return {k: median(r[k] for r in runs) for k in keys}


def _ratio(new: float, old: float) -> float:
    return new / old if old else float("nan")


def compare_table(runs: Mapping[str, Sequence[Mapping[Row, float]]]) -> str:
    """Rows of both sides: the median of each side's rounds and candidate / baseline."""
    old, new = medians(runs["baseline"]), medians(runs["candidate"])
    rows: list[list[object]] = []
    previous = None
    for (load, what), value in old.items():
        if (load, what) in new:
            ratio = _ratio(new[(load, what)], value) if value else ""  # no ratio to 0 errors
            rows.append([load if load != previous else "", what, value, new[(load, what)], ratio])
            previous = load
    return table(["load", "", "baseline", "candidate", "ratio"], rows)


def floors_table(rounds: Sequence[Mapping[str, float]]) -> str:
    """Each floor: the median of the rounds, then each round's figure."""
    mid = medians(rounds)
    return table(["floor", "median", "rounds"],
                 [[name, value, " ".join(f"{r[name]:.1f}" for r in rounds)] for name, value in mid.items()])


def floor_ratios(side: Mapping[Row, float], floors: Mapping[str, float]) -> dict[str, float]:
    """One side's CPU per lone append over the grpc.aio round's: the server's and each storage node's over the
    round's server side, the client's over its client side (the Python client's and the raw one's)."""
    out: dict[str, float] = {}
    for load in (LONE, RAW_LONE):
        for (where, what), value in side.items():
            if where != load or not what.endswith(" CPU us") or what.startswith("all "):
                continue
            process = what.removesuffix(" CPU us")
            floor = floors[ECHO_CLIENT] if process == "client" else floors[ECHO_SERVER]
            out[f"{load}: {process} / grpc round's {'client' if process == 'client' else 'server'}"] = \
                _ratio(value, floor)
    return out


def target_of(name: str) -> float | None:
    """The issue's target of a ratio of floor_ratios (the Python client's rows only)."""
    if not name.startswith(LONE):
        return None
    process = name.split(": ", 1)[1].split(" /")[0]
    return next((t for prefix, t in TARGETS.items() if process.startswith(prefix)), None)


def ratios_table(runs: Mapping[str, Sequence[Mapping[Row, float]]], floor_rounds: Sequence[Mapping[str, float]]
                 ) -> str:
    """floor_ratios of each side's medians against the floors' medians, with the targets and the candidate's
    verdict; then the I/O shapes' ratios (the median of each round's), the same code on both sides, with whether
    the floor itself is under the target it bounds."""
    floors = medians(floor_rounds)
    each = {name: floor_ratios(medians(runs[name]), floors) for name in SIDES}
    rows: list[list[object]] = []
    for name, old in each["baseline"].items():
        new = each["candidate"].get(name, float("nan"))
        target = target_of(name)
        rows.append([name, f"<= {target:g}" if target is not None else "", old, new,
                     verdict(new <= target) if target is not None else ""])
    for name, ratio in medians([shape_ratios(r) for r in floor_rounds]).items():
        target = shape_target(name)
        rows.append([name, f"<= {target:g}" if target is not None else "", ratio, ratio,
                     ("floor under" if ratio <= target else "floor ABOVE") if target is not None else ""])
    return table(["CPU per lone append / floor", "target", "baseline", "candidate", "candidate"], rows)
