"""Configuration files: defaults, dotted and nested keys, clear errors."""

from __future__ import annotations

import pytest

from waltz_common.config import ZOOKEEPER_KEYS, ConfigError, Key, boolean, load

KEYS = (*ZOOKEEPER_KEYS, Key("server.port", int, doc="port"), Key("server.flag", boolean, False, "a flag"))


def test_nested_and_dotted_keys_with_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("zookeeper:\n  connectString: 127.0.0.1:2181\ncluster.root: /w\nserver.port: '55180'\n")
    config = load(path, KEYS)
    assert config["zookeeper.connectString"] == "127.0.0.1:2181"
    assert config["server.port"] == 55180
    assert config["zookeeper.sessionTimeout"] == 30000
    assert config["server.flag"] is False


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
