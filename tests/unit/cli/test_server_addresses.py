"""--server-addresses: every command that lists it in --help accepts it (the others do not list it), and
`cluster verify` reports missing servers and unassigned or under-replicated partitions (check_missing, pure)."""

from __future__ import annotations

import argparse

from tests.unit.cli.test_verify import NODES, healthy
from waltz_cli import perf
from waltz_cli.context import Context
from waltz_cli.main import build_parser
from waltz_cli.verify import ServerPartition, ServerView, check_missing

USES_SERVERS = {"client", "server", "perf"}
"""The groups whose commands work from --server-addresses; `cluster verify` takes them as the servers expected."""


def leaf_commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """(group, command) -> its parser, for every command of the tree (and `dev`, which has no subcommands)."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and path:
            found[path] = parser
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))

    walk(build_parser(), ())
    return found


def test_only_the_commands_that_accept_server_addresses_list_it() -> None:
    commands = leaf_commands()
    assert ("perf", "produce") in commands and ("server", "list") in commands and ("dev",) in commands
    for path, parser in commands.items():
        listed = "--server-addresses" in parser.format_help()
        assert listed == (path[0] in USES_SERVERS or path == ("cluster", "verify")), path


def test_perf_builds_a_client_of_the_servers_without_zookeeper() -> None:
    ctx = Context(connect_string=None, root=None, servers=("a:1", "b:2"), rpc_timeout_s=5.0)
    config = perf._client_config(ctx, **{"client.maxConcurrentTransactions": 3})
    assert config["client.servers"] == ["a:1", "b:2"] and config["client.maxConcurrentTransactions"] == 3
    assert not [key for key in config if key.startswith(("zookeeper.", "cluster."))]


def test_a_missing_server_is_found_against_what_is_expected() -> None:
    facts = healthy()  # one server, s:1, owns both partitions
    assert check_missing(facts, [0, 1]).passed
    assert check_missing(facts, [0, 1], expected_servers=1, expected_addresses=("s:1",)).passed
    gone = check_missing(facts, [0, 1], expected_servers=2, expected_addresses=("s:1", "s:2"))
    assert gone.reasons == ["1 server(s) missing: 1 registered, 2 expected",
                            "server s:2 is missing: it is not registered"]
    facts.servers[2] = ServerView("s:2", error="server 2 (s:2): UNAVAILABLE")
    assert check_missing(facts, [0, 1]).reasons == [
        "server 2 (s:2) is registered but does not answer: server 2 (s:2): UNAVAILABLE"]


def test_unassigned_and_under_replicated_partitions_are_named_even_with_a_quorum() -> None:
    facts = healthy()
    facts.ownership[1] = (-1, 3)
    facts.servers[1].partitions = {0: ServerPartition(3, 4, True)}
    facts.nodes["h:3"] = "storage node h:3: nothing listens on its admin port"
    assert check_missing(facts, [0, 1]).reasons == [
        "partition 1 is unassigned: no server owns it",
        "partition 0 is under-replicated: 2 of 3 replicas usable (down: h:3)",
        "partition 1 is under-replicated: 2 of 3 replicas usable (down: h:3)",
    ]
    facts = healthy()
    facts.assignments[NODES[2]] = [0]  # partition 1 lost its third replica in ZooKeeper's assignment
    assert check_missing(facts, [0, 1]).reasons == [
        "partition 1 is under-replicated: 2 replica(s) assigned, 3 expected"]
    assert check_missing(facts, [0], replicas=4).reasons == [
        "partition 0 is under-replicated: 3 replica(s) assigned, 4 expected"]
    assert check_missing(facts, [1], replicas=2).passed
    # a scale-out that gave one partition a fourth replica does not make the others under-replicated (the container
    # test's `cluster verify` failed so: the default expectation was the most any partition had)
    four = healthy()
    four.num_partitions = 4
    for node in NODES:
        four.assignments[node] = [0, 1, 2, 3]
    four.assignments["h:9"] = [0]
    assert not [r for r in check_missing(four, [0, 1, 2, 3]).reasons if "replica(s) assigned" in r]

