"""bench.round's pure part (bench.round_tables: rows from the loads' results, medians of the rounds, the ratios to
the baseline and to the floors, the tables) and its fdatasync floor."""

from pathlib import Path
from typing import Any

from bench.io_shape import Frames, Rounds
from bench.round import fdatasync_us
from bench.round_tables import (
    ECHO_CLIENT,
    ECHO_SERVER,
    FDATASYNC,
    compare_table,
    cpu_rows,
    floor_ratios,
    floor_values,
    floors_table,
    medians,
    open_rows,
    ratios_table,
    shape_ratios,
    shape_values,
)

LONE = "Python client, 1 in flight"


def closed(committed: int, server: float, storage: float, client: float) -> dict[str, object]:
    cpu = {"client": client, "storage-1": storage, "zookeeper": 9.0, "server-0": server, "storage-0": storage}
    return {"committed": committed, "errors": 0, "cpu": cpu}


def test_cpu_rows_give_us_per_committed_append_of_each_process_servers_first_zookeeper_left_out() -> None:
    rows = cpu_rows(LONE, closed(2000, server=1.0, storage=0.5, client=0.25), seconds=4.0)
    assert list(rows) == [(LONE, "committed/s"), (LONE, "server-0 CPU us"), (LONE, "storage-0 CPU us"),
                          (LONE, "storage-1 CPU us"), (LONE, "client CPU us"), (LONE, "all processes CPU us"),
                          (LONE, "errors")]
    assert rows[(LONE, "committed/s")] == 500
    assert rows[(LONE, "server-0 CPU us")] == 500 and rows[(LONE, "storage-1 CPU us")] == 250
    assert rows[(LONE, "all processes CPU us")] == 1125


def test_open_rows_are_in_ms_by_rate_offered() -> None:
    rows = open_rows(5000, {"committed": 10_000, "errors": 3, "p50": 0.002, "p99": 0.01, "p99.9": 0.05}, 2.0)
    assert rows == {("5,000/s offered", "committed/s"): 5000, ("5,000/s offered", "p50 ms"): 2.0,
                    ("5,000/s offered", "p99 ms"): 10.0, ("5,000/s offered", "p99.9 ms"): 50.0,
                    ("5,000/s offered", "errors"): 3.0}
    counted = open_rows(5000, {"committed": 10_000, "errors": 0, "p50": 0.002, "p99": 0.01, "p99.9": 0.05,
                               "store_batches": 400, "store_batch_appends": 12_000}, 2.0)
    assert counted[("5,000/s offered", "appends/store batch")] == 30


def test_floors_per_round_and_without_a_framed_port() -> None:
    echo = {"rounds": 1000, "cpu": {"server": 0.1, "client": 0.12}}
    session = {side: {"append 1": 60.0, "append 1, round trip": 150.0} for side in ("baseline", "candidate")}
    values = floor_values(echo, session, 700.0)
    assert values[ECHO_SERVER] == 100 and round(values[ECHO_CLIENT]) == 120 and values[FDATASYNC] == 700
    assert values["framed storage round (candidate's port): node CPU us"] == 60
    assert not [name for name in floor_values(echo, None, 700.0) if name.startswith("framed")]


def test_medians_keep_the_rows_every_run_has_in_the_first_runs_order() -> None:
    runs = [{"b": 1.0, "a": 5.0, "c": 1.0}, {"a": 1.0, "b": 3.0}, {"b": 2.0, "a": 2.0}]
    assert medians(runs) == {"b": 2.0, "a": 2.0} and list(medians(runs)) == ["b", "a"]
    assert medians([]) == {}


def test_the_compare_table_names_each_load_once_and_gives_candidate_over_baseline() -> None:
    old = cpu_rows(LONE, closed(1000, server=0.6, storage=0.3, client=0.4), 1.0)
    new = cpu_rows(LONE, closed(1000, server=0.3, storage=0.3, client=0.4), 1.0)
    text = compare_table({"baseline": [old], "candidate": [new]})
    assert text.count(LONE) == 1
    server = next(line for line in text.splitlines() if "server-0" in line).split()
    assert server[-3:] == ["600", "300", "0.5"]
    errors = next(line for line in text.splitlines() if line.strip().startswith("errors")).split()
    assert errors == ["errors", "0", "0"]  # no ratio to none


def test_the_ratios_to_the_floors_use_the_stream_side_of_each_process_and_judge_the_python_clients_rows() -> None:
    floors = {ECHO_SERVER: 100.0, ECHO_CLIENT: 200.0, FDATASYNC: 500.0}
    side = {**cpu_rows(LONE, closed(1000, server=0.15, storage=0.12, client=0.3), 1.0),
            **cpu_rows("raw client, 1 in flight", closed(1000, server=0.5, storage=0.1, client=0.1), 1.0),
            **cpu_rows("Python client, 10 in flight", closed(1000, server=0.9, storage=0.9, client=0.9), 1.0)}
    ratios = floor_ratios(side, floors)
    assert ratios[f"{LONE}: server-0 / grpc round's server"] == 1.5
    assert ratios[f"{LONE}: storage-0 / grpc round's server"] == 1.2
    assert ratios[f"{LONE}: client / grpc round's client"] == 1.5
    assert ratios["raw client, 1 in flight: server-0 / grpc round's server"] == 5
    assert not [name for name in ratios if "10 in flight" in name]
    text = ratios_table({"baseline": [side], "candidate": [side]}, [floors])
    verdicts = {line.split(":")[1].split("/")[0].strip(): line.split()[-1] for line in text.splitlines()
                if line.startswith(LONE)}
    assert verdicts == {"server-0": "met", "storage-0": "MISSED", "storage-1": "MISSED", "client": "met"}
    raw = next(line for line in text.splitlines() if line.startswith("raw client, 1 in flight: server-0"))
    assert "<=" not in raw and "met" not in raw


def test_the_floors_table_gives_the_median_and_each_round() -> None:
    text = floors_table([{ECHO_SERVER: 80.0}, {ECHO_SERVER: 120.0}, {ECHO_SERVER: 90.0}])
    assert text.splitlines()[-1].split()[-4:] == ["90", "80.0", "120.0", "90.0"]


def test_the_fdatasync_floor_appends_in_the_directory_and_leaves_nothing(tmp_path: Path) -> None:
    assert fdatasync_us(tmp_path, 5) > 0
    assert list(tmp_path.iterdir()) == []


def shape(rounds: int, server: float, peers: list[float], seconds: float = 1.0) -> dict[str, Any]:
    return {"rounds": rounds, "seconds": seconds,
            "cpu": {"server": server, "client": 9.0, **{f"peer-{i}": p for i, p in enumerate(peers)}}}


def test_the_shape_floors_give_the_servers_cpu_per_round_of_each_variant_and_a_peers() -> None:
    network = {"Lone 3@1": shape(1000, 0.15, [0.02, 0.03, 0.04]), "Pipelined 3@10": shape(2000, 0.2, [0.05] * 3),
               "Lone 1@1": shape(1000, 0.12, [0.03])}
    values = shape_values(network, {"Lone 3@1": shape(500, 0.1, [0.04, 0.05, 0.06], seconds=2.0),
                                    "Pipelined 3@1": shape(400, 0.1, [0.2] * 3)})
    assert {name: round(value, 6) for name, value in values.items()} == {
        "server I/O shape, 3 peers, 1 in flight, one task: server CPU us": 150,
        "server I/O shape, 3 peers, 10 in flight, reader + writer tasks: server CPU us": 100,
        "server I/O shape, 1 peer, 1 in flight, one task: server CPU us": 120,
        "server I/O shape, no disk: a peer's CPU us": 30,
        "server I/O shape with storage peers, 3 peers, 1 in flight, one task: server CPU us": 200,
        "server I/O shape with storage peers, 3 peers, 1 in flight, reader + writer tasks: server CPU us": 250,
        "storage I/O shape, pwrite + fdatasync: a peer's CPU us": 100,  # of the first variant's round
        "storage I/O shape, pwrite + fdatasync: round wall us": 4000,
    }
    assert shape_values(network, None) == {name: value for name, value in values.items()
                                           if "storage" not in name}
    echo = {"rounds": 1000, "cpu": {"server": 0.1, "client": 0.1}}
    assert floor_values(echo, None, 700.0, values)["server I/O shape, no disk: a peer's CPU us"] == \
        values["server I/O shape, no disk: a peer's CPU us"]


def test_the_shape_ratios_are_over_the_grpc_rounds_server_cpu_and_leave_out_the_wall_time() -> None:
    floors = {ECHO_SERVER: 100.0, ECHO_CLIENT: 120.0, FDATASYNC: 600.0,
              **shape_values({"Lone 3@1": shape(1000, 0.25, [0.03] * 3)},
                             {"Lone 3@1": shape(1000, 0.3, [0.08] * 3, seconds=3.0)})}
    ratios = {name: round(value, 6) for name, value in shape_ratios(floors).items()}
    assert ratios == {"server I/O shape, 3 peers, 1 in flight, one task: server / grpc round's server": 2.5,
                      "server I/O shape, no disk: a peer's / grpc round's server": 0.3,
                      "server I/O shape with storage peers, 3 peers, 1 in flight, one task: server / grpc round's "
                      "server": 3.0,
                      "storage I/O shape, pwrite + fdatasync: a peer's / grpc round's server": 0.8}


def test_with_the_floors_alone_the_ratios_table_gives_the_shapes_median_ratio_and_whether_it_is_under_the_target(
        ) -> None:
    def floors(server: float, peer: float) -> dict[str, float]:
        return {ECHO_SERVER: 100.0, ECHO_CLIENT: 100.0, FDATASYNC: 600.0,
                **shape_values({"Lone 3@1": shape(1000, server, [0.02] * 3), "Pipelined 3@10": shape(1000, 0.5, [0])},
                               {"Lone 3@1": shape(1000, 0.2, [peer] * 3)})}

    text = ratios_table({"baseline": [{}, {}, {}], "candidate": [{}, {}, {}]},
                        [floors(0.15, 0.05), floors(0.25, 0.09), floors(0.18, 0.2)])
    lines = {line.split(" / ")[0]: line.split() for line in text.splitlines()[2:]}
    assert lines["server I/O shape, 3 peers, 1 in flight, one task: server"][-6:] == \
        ["<=", "2", "1.8", "1.8", "floor", "under"]
    assert lines["storage I/O shape, pwrite + fdatasync: a peer's"][-6:] == ["<=", "1", "0.9", "0.9", "floor", "under"]
    assert lines["server I/O shape with storage peers, 3 peers, 1 in flight, one task: server"][-6:] == \
        ["<=", "2", "2", "2", "floor", "under"]
    assert lines["server I/O shape, 3 peers, 10 in flight, reader + writer tasks: server"][-3:] == \
        ["server", "5", "5"]  # no target at 10 in flight
    above = ratios_table({"baseline": [{}], "candidate": [{}]}, [floors(0.3, 0.05)])
    assert "floor ABOVE" in next(line for line in above.splitlines() if "one task" in line)
    assert not [line for line in text.splitlines() if line.startswith("Python client")]


class Sent:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.frames.append(data)


def test_a_shape_round_is_done_at_the_majoritys_answer_once_and_forgotten_after_the_last() -> None:
    rounds = Rounds()
    links = [Frames(rounds.answer) for _ in range(3)]
    for link in links:
        link.transport = Sent()  # type: ignore[assignment]
    rounds.links = links
    done: list[object] = []
    rounds.start(b"m" * 544, 3, done.append)
    rounds.start(b"n" * 544, 1, done.append)
    assert [len(link.transport.frames) for link in links] == [2, 1, 1]  # type: ignore[union-attr]
    frame = links[1].transport.frames[0]  # type: ignore[union-attr]
    assert len(frame) == 4 + 573 and int.from_bytes(frame[:4], "big") == 573 and frame[12:556] == b"m" * 544
    answer = (16).to_bytes(4, "big") + (0).to_bytes(8, "big") + bytes(8)
    links[2].data_received(answer)
    assert done == []
    links[0].data_received(answer[:3])  # a frame in pieces, then two in one chunk
    links[0].data_received(answer[3:] + (16).to_bytes(4, "big") + (1).to_bytes(8, "big") + bytes(8))
    assert done == [None, None] and set(rounds.open) == {0}
    links[1].data_received(answer)
    assert done == [None, None] and rounds.open == {}
