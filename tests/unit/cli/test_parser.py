"""Argument parsing, global options, configuration and one-line usage errors of `waltz`."""

from __future__ import annotations

import re

import pytest

from tests.unit.cli.helpers import waltz
from waltz_cli.context import Context
from waltz_cli.main import build_parser
from waltz_common import cluster_admin
from waltz_common.config import EXIT_CONFIG, ConfigError
from waltz_common.zk import ZkPaths

COMMANDS = {
    "cluster": ["create", "delete", "list", "show-key", "verify", "check-connectivity"],
    "storage": [
        "add-node",
        "remove-node",
        "assign",
        "unassign",
        "auto-assign",
        "list",
        "availability",
        "add-partition",
        "remove-partition",
        "sync",
        "recover-partition",
        "max-transaction-id",
    ],
    "server": ["list", "partitions"],
    "client": ["high-water-mark", "tail", "validate"],
    "disk": ["dump-control", "dump-segment", "verify-segment"],
}


@pytest.mark.parametrize(("group", "command"), [(g, c) for g, cs in COMMANDS.items() for c in cs])
def test_every_command_answers_help(capsys, group, command):
    run = waltz(capsys, group, command, "--help")
    assert run.code == 0
    assert run.out.startswith(f"usage: waltz {group} {command}")


def test_global_options_work_before_and_after_the_command():
    parser = build_parser()
    before = parser.parse_args(["--json", "--zookeeper", "zk:2181", "--root", "/w", "cluster", "list"])
    after = parser.parse_args(["cluster", "list", "--json", "--zookeeper", "zk:2181", "--root", "/w"])
    for args in (before, after):
        assert (args.json, args.zookeeper, args.root, args.timeout) == (True, "zk:2181", "/w", 10.0)


def test_subcommand_defaults_do_not_hide_top_level_options():
    args = build_parser().parse_args(["--timeout", "3", "cluster", "show-key"])
    assert args.timeout == 3.0 and args.json is False and args.progress is None


def test_config_file_supplies_zookeeper_and_flags_override(tmp_path):
    conf = tmp_path / "cli.yaml"
    conf.write_text(
        "zookeeper:\n  connectString: zk:2181\n  connectTimeoutSeconds: 2.5\n  sessionTimeoutSeconds: 9\n"
        "cluster.root: /a\n"
    )
    ctx = Context.from_args(build_parser().parse_args(["-c", str(conf), "cluster", "list"]))
    assert (ctx.connect_string, ctx.root, ctx.connect_timeout_s, ctx.session_timeout_s) == ("zk:2181", "/a", 2.5, 9.0)
    old = tmp_path / "old.yaml"  # the milliseconds key of before still works, with a warning
    old.write_text("zookeeper:\n  connectString: zk:2181\n  connectTimeout: 2500\ncluster.root: /a\n")
    with pytest.warns(DeprecationWarning, match=r"zookeeper\.connectTimeout \(milliseconds\) is deprecated"):
        ctx = Context.from_args(build_parser().parse_args(["-c", str(old), "cluster", "list"]))
    assert ctx.connect_timeout_s == 2.5
    ctx = Context.from_args(build_parser().parse_args(["-c", str(conf), "--root", "/b", "cluster", "list"]))
    assert ctx.root == "/b"


def test_waltz_variables_fill_in_what_the_file_and_the_flags_leave_out(tmp_path):
    env = {"WALTZ_ZOOKEEPER_CONNECT_STRING": "envzk:2181", "WALTZ_CLUSTER_ROOT": "/env",
           "WALTZ_ZOOKEEPER_SESSION_TIMEOUT_SECONDS": "12", "WALTZ_CLIENT_SERVERS": "s1:9091,s2:9091",
           "WALTZ_CLIENT_MOUNT_TIMEOUT": "5", "WALTZ_EVENT_LOOP": "asyncio", "WALTZ_CLUSTER_ROOTS": "/ignored"}
    ctx = Context.from_args(build_parser().parse_args(["cluster", "list"]), environ=env)
    assert (ctx.connect_string, ctx.root, ctx.session_timeout_s, ctx.servers) == (
        "envzk:2181", "/env", 12.0, ("s1:9091", "s2:9091"))
    assert ctx.connect_timeout_s == 10.0  # --timeout's default, as without the variables
    flags = ["--zookeeper", "flag:2181", "--server-addresses", "s3:9091", "cluster", "list"]
    ctx = Context.from_args(build_parser().parse_args(flags), environ=env)  # an explicit flag wins
    assert (ctx.connect_string, ctx.root, ctx.servers) == ("flag:2181", "/env", ("s3:9091",))
    conf = tmp_path / "cli.yaml"
    conf.write_text("cluster.root: /file\n")
    ctx = Context.from_args(build_parser().parse_args(["-c", str(conf), "cluster", "list"]), environ=env)
    assert (ctx.connect_string, ctx.root) == ("envzk:2181", "/file")  # the file wins over a variable
    with pytest.raises(ConfigError, match=r"WALTZ_.*zookeeper\.sessionTimeoutSeconds: 'soon' is not a number"):
        Context.from_args(build_parser().parse_args(["cluster", "list"]),
                          environ={"WALTZ_ZOOKEEPER_SESSION_TIMEOUT_SECONDS": "soon"})
    ctx = Context.from_args(build_parser().parse_args(["cluster", "list"]), environ={})
    assert (ctx.connect_string, ctx.root, ctx.servers) == (None, None, ())


def test_tls_files_from_the_config_file_or_flags(tmp_path, capsys):
    for name in ("op.pem", "op-key.pem", "ca.pem", "other.pem"):
        (tmp_path / name).write_text("x")
    conf = tmp_path / "cli.yaml"
    conf.write_text(
        f"zookeeper.connectString: zk:2181\ncluster.root: /a\ntls:\n  certFile: {tmp_path}/op.pem\n"
        f"  keyFile: {tmp_path}/op-key.pem\n  caFile: {tmp_path}/ca.pem\nzookeeper.auth: digest:operator:pw\n"
    )
    ctx = Context.from_args(build_parser().parse_args(["-c", str(conf), "cluster", "list"]))
    assert ctx.tls is not None and (ctx.tls.cert_file, ctx.tls.ca_file) == (f"{tmp_path}/op.pem", f"{tmp_path}/ca.pem")
    assert ctx.zk_security is not None and ctx.zk_security.auth == ("digest", "operator:pw")
    assert ctx.zookeeper_security_config() == {"zookeeper.auth": "digest:operator:pw"}
    argv = ["-c", str(conf), "--tls-cert", f"{tmp_path}/other.pem", "cluster", "list"]
    assert Context.from_args(build_parser().parse_args(argv)).tls.cert_file == f"{tmp_path}/other.pem"
    assert Context.from_args(build_parser().parse_args(["--zookeeper", "z:1", "cluster", "list"])).tls is None
    half = waltz(capsys, "--tls-cert", f"{tmp_path}/op.pem", "cluster", "list")
    assert half.code == EXIT_CONFIG and "missing ['tls.keyFile', 'tls.caFile']" in half.err


def _one_line_error(run, code=2):
    assert run.code == code
    assert run.out == ""
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert "Traceback" not in run.err
    return lines[0]


def test_unknown_command_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "cluster", "bogus"))
    assert "invalid choice: 'bogus'" in line


def test_missing_required_argument_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "cluster", "create", "--zookeeper", "zk:1", "--root", "/r", "-n", "x"))
    assert "--partitions" in line


def test_bad_number_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "cluster", "create", "-n", "x", "-p", "many"))
    assert "invalid int value" in line


def test_no_zookeeper_given_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "cluster", "show-key"))
    assert "no ZooKeeper given" in line


def test_missing_config_file_is_one_line(capsys, tmp_path):
    line = _one_line_error(waltz(capsys, "-c", str(tmp_path / "nope.yaml"), "cluster", "list"), code=EXIT_CONFIG)
    assert "does not exist" in line


def test_bad_config_key_is_one_line(capsys, tmp_path):
    conf = tmp_path / "cli.yaml"
    conf.write_text("zookeeper.connectString: zk:1\ncluster.root: /a\nbogus.key: 1\n")
    line = _one_line_error(waltz(capsys, "-c", str(conf), "cluster", "list"), code=EXIT_CONFIG)
    assert "unknown configuration key(s): bogus.key" in line


def test_bad_cluster_root_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "--zookeeper", "zk:1", "--root", "relative", "cluster", "show-key"), code=1)
    assert "absolute znode path" in line


def test_bad_boolean_for_availability_is_one_line(capsys):
    line = _one_line_error(waltz(capsys, "storage", "availability", "-s", "h:1", "-p", "0", "--online", "maybe"))
    assert "not true or false" in line


def test_debug_shows_the_traceback(capsys):
    run = waltz(capsys, "--debug", "cluster", "show-key")
    assert run.code == 2
    assert "Traceback" in run.err and "no ZooKeeper given" in run.err


def test_no_command_prints_help(capsys):
    run = waltz(capsys)
    assert run.code == 2 and "usage: waltz" in run.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-a", "-5", "-g", "-3"], "argument -a/--admin-port: -5 is out of range (1..65535)"),
        (["-a", "70000"], "argument -a/--admin-port: 70000 is out of range (1..65535)"),
        (["-a", "0"], "argument -a/--admin-port: 0 is out of range (1..65535)"),
        (["-a", "5.5"], "argument -a/--admin-port: '5.5' is not an integer"),
        (["-a", "55291", "-g", "-3"], "argument -g/--group: -3 is out of range (0..2147483647)"),
    ],
)
def test_add_node_refuses_ports_and_groups_out_of_range(capsys, args, message):
    run = waltz(capsys, "--zookeeper", "zk:1", "--root", "/r", "storage", "add-node", "-s", "h:55290", *args)
    assert run.code == 2 and message in run.err, run.err


def test_registering_a_node_checks_its_admin_port_and_group_before_writing():
    with pytest.raises(ValueError, match=re.escape("admin port: -5 is out of range (1..65535)")):
        cluster_admin.add_storage_node(None, ZkPaths("/r"), "h:55290", -5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("group id: -3 is out of range")):
        cluster_admin.add_storage_node(None, ZkPaths("/r"), "h:55290", 55291, -3)  # type: ignore[arg-type]
