"""Configuration files: defaults, dotted and nested keys, clear errors."""

from __future__ import annotations

import re
import warnings

import pytest

from waltz_common.config import (
    ZOOKEEPER_KEYS,
    ConfigError,
    Key,
    boolean,
    load,
    zookeeper_connect_timeout_s,
    zookeeper_session_timeout_s,
)

KEYS = (*ZOOKEEPER_KEYS, Key("server.port", int, doc="port"), Key("server.flag", boolean, False, "a flag"))


def test_nested_and_dotted_keys_with_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("zookeeper:\n  connectString: 127.0.0.1:2181\ncluster.root: /w\nserver.port: '55180'\n")
    config = load(path, KEYS)
    assert config["zookeeper.connectString"] == "127.0.0.1:2181"
    assert config["server.port"] == 55180
    assert config["zookeeper.sessionTimeoutSeconds"] == 30.0 and config["zookeeper.sessionTimeout"] is None
    assert config["zookeeper.connectTimeoutSeconds"] == 10.0 and config["zookeeper.connectTimeout"] is None
    assert config["server.flag"] is False


@pytest.mark.parametrize(("new", "old", "seconds_of", "default"), [
    ("zookeeper.sessionTimeoutSeconds", "zookeeper.sessionTimeout", zookeeper_session_timeout_s, 30.0),
    ("zookeeper.connectTimeoutSeconds", "zookeeper.connectTimeout", zookeeper_connect_timeout_s, 10.0),
])
def test_the_zookeeper_timeouts_are_in_seconds_and_the_millisecond_keys_still_work_with_a_warning(
        tmp_path, caplog, new, old, seconds_of, default):
    path = tmp_path / "c.yaml"
    base = "zookeeper.connectString: x\ncluster.root: /w\nserver.port: 1\n"
    path.write_text(base + f"{new}: 6.5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the seconds key warns of nothing
        assert seconds_of(load(path, KEYS)) == 6.5
    assert seconds_of(load(path, KEYS, {new: None})) == default
    old_short = old.split(".")[1]
    path.write_text(base + f"zookeeper:\n  {old_short}: 4000\n")
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} \(milliseconds\) is deprecated: use "
                                                 rf"{re.escape(new)} \(seconds\)"):
        assert seconds_of(load(path, KEYS)) == 4.0
    assert any(new in r.getMessage() for r in caplog.records)
    path.write_text(base + f"{old}: 4000\n{new}: 4\n")
    with pytest.raises(ConfigError, match=rf"set {re.escape(new)} \(seconds\) only"):
        seconds_of(load(path, KEYS))
    path.write_text(base + f"{new}: 0\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(new)}: 0 is out of range"):
        load(path, KEYS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cluster.root: /w\nserver.port: 1\n", "required key zookeeper.connectString is missing"),
        ("zookeeper.connectString: x\ncluster.root: /w\nserver.port: abc\n", "server.port: invalid literal"),
        ("zookeeper.connectString: x\ncluster.root: /w\nserver.port: 1\nserver.prot: 2\n", "unknown .*server.prot"),
        ("- a list\n", "top level must be a mapping"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(path, KEYS)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml", KEYS)
