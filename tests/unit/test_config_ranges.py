"""Issue 28, configuration: every key's type and range is checked, with one line naming the key, the value and
the range; a wildcard listen address needs an advertised one; the example files run side by side on one host and
name one cluster root with the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from waltz_client.config import ALL_KEYS as CLIENT_KEYS
from waltz_client.config import ClientConfig
from waltz_common.config import Config, ConfigError, Integer, Key, Number, load
from waltz_server.config import advertised, all_keys, check
from waltz_storage.config import STORAGE_KEYS

ROOT = Path(__file__).resolve().parents[2]
BASE = {"zookeeper.connectString": "127.0.0.1:2181", "cluster.root": "/waltz/my_cluster"}
SERVER = {**BASE, "server.port": 55280}
STORAGE = {**BASE, "storage.port": 55290, "storage.admin.port": 55291, "storage.directory": "/tmp/x"}


def server_config(**values: object) -> Config:
    return Config(all_keys(), {**SERVER, **values}, "server.yaml")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("server.port", 99999, "server.port: 99999 is out of range (1..65535)"),
        ("server.port", -1, "server.port: -1 is out of range (1..65535)"),
        ("server.port", 0, "server.port: 0 is out of range (1..65535)"),
        ("server.metrics.port", 70000, "server.metrics.port: 70000 is out of range (0..65535)"),
        ("server.health.port", -5, "server.health.port: -5 is out of range (0..65535)"),
        ("server.port", 5.5, "server.port: 5.5 is not an integer (1..65535)"),
        ("server.port", 55280.0, "server.port: 55280.0 is not an integer (1..65535)"),
        ("server.port", True, "server.port: True is a boolean, not an integer (1..65535)"),
        ("server.appendQueueSize", True, "server.appendQueueSize: True is a boolean"),
        ("server.appendQueueSize", 0, "server.appendQueueSize: 0 is out of range (at least 1)"),
        ("storage.maxRetryInterval", 2.5, "storage.maxRetryInterval: 2.5 is not an integer"),
        ("server.shutdownGraceSeconds", -1, "server.shutdownGraceSeconds: -1 is out of range (at least 0)"),
        ("server.shutdownGraceSeconds", True, "server.shutdownGraceSeconds: True is a boolean"),
        ("storage.requestTimeoutSeconds", 0, "storage.requestTimeoutSeconds: 0 is out of range (above 0)"),
        ("server.advertisedAddress", "proxy:99999", "server.advertisedAddress: 'proxy:99999': port 99999 is out"),
        ("server.host", 127, "server.host: 127 is not a string"),
    ],
)
def test_server_values_out_of_type_or_range_are_one_line_naming_key_value_and_range(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        server_config(**{key: value})
    assert str(refused.value).startswith("server.yaml: ") and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("storage.port", 65536, "storage.port: 65536 is out of range (0..65535)"),
        ("storage.admin.port", -1, "storage.admin.port: -1 is out of range (0..65535)"),
        ("storage.metrics.port", 70000, "storage.metrics.port: 70000 is out of range (0..65535)"),
        ("storage.maxRecordBytes", 1.5, "storage.maxRecordBytes: 1.5 is not an integer"),
        ("storage.segment.size.threshold", True, "storage.segment.size.threshold: True is a boolean"),
        ("zookeeper.sessionTimeout", 0, "zookeeper.sessionTimeout: 0 is out of range (at least 1)"),
    ],
)
def test_storage_values_out_of_type_or_range_are_refused(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config(STORAGE_KEYS, {**STORAGE, key: value}, "storage.yaml")


def test_client_values_out_of_type_or_range_are_refused():
    with pytest.raises(ConfigError, match=re.escape("client.maxBatchSize: True is a boolean")):
        ClientConfig.of({**BASE, "client.maxBatchSize": True})
    with pytest.raises(ConfigError, match=re.escape("client.maxRetries: -2 is out of range (at least -1)")):
        ClientConfig.of({**BASE, "client.maxRetries": -2})
    with pytest.raises(ConfigError, match=re.escape("'h:0': port 0 is out of range (1..65535)")):
        ClientConfig.of({"client.servers": "h:0"}, zookeeper_required=False)
    assert ClientConfig.of({**BASE, "client.maxRetries": -1}).max_retries == -1


def every_numeric_key() -> list[Key]:
    keys = {k.name: k for k in (*all_keys(), *STORAGE_KEYS, *CLIENT_KEYS)}
    return [k for k in keys.values() if isinstance(k.kind, Integer | Number)]


def test_every_numeric_key_is_range_checked_and_refuses_booleans():
    """No integer or float key is left a bare int/float (which takes 5.9 as 5, true as 1, 99999 as a port)."""
    bare = [k.name for k in (*all_keys(), *STORAGE_KEYS, *CLIENT_KEYS) if k.kind in (int, float)]
    assert bare == []
    for key in every_numeric_key():
        with pytest.raises(ValueError, match="boolean"):
            key.kind(True)
        if isinstance(key.kind, Integer):
            with pytest.raises(ValueError, match="not an integer"):
                key.kind(float(key.default if isinstance(key.default, int) else 1))
        assert key.default is None or key.required or key.kind(key.default) == key.default, key.name


def test_digit_strings_still_count_as_integers():
    assert server_config(**{"server.port": "55180"})["server.port"] == 55180
    assert Integer(-1)(" -1 ") == -1  # an environment variable's value (WALTZ_CLIENT_MAX_RETRIES)
    for text in ("+-5", "--1", "1_000", "\u0663"):  # one line naming the value, not int()'s own message
        with pytest.raises(ValueError, match=re.escape(f"{text!r} is not an integer")):
            Integer(1)(text)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]"])
def test_a_wildcard_host_needs_an_advertised_address(host):
    with pytest.raises(ConfigError, match=r"server\.host .* set server\.advertisedAddress"):
        check(server_config(**{"server.host": host}))
    config = server_config(**{"server.host": host, "server.advertisedAddress": "waltz-1.example.com:55280"})
    check(config)
    assert advertised(config, 41234) == ("waltz-1.example.com", 55280)
    assert advertised(server_config(), 41234) == ("127.0.0.1", 41234)


EXAMPLES = {name: ROOT / "config" / f"{name}.example.yaml" for name in ("server", "storage")}


def test_the_example_files_are_valid_and_their_ports_do_not_collide():
    server = load(EXAMPLES["server"], all_keys())
    storage = load(EXAMPLES["storage"], STORAGE_KEYS)
    check(server)
    server_ports = [server[k] for k in ("server.port", "server.metrics.port", "server.health.port") if server[k]]
    storage_ports = [
        storage[k] for k in ("storage.port", "storage.admin.port", "storage.metrics.port", "storage.health.port")
        if storage[k]
    ]
    ports = server_ports + storage_ports
    assert len(ports) == len(set(ports)), ports
    assert server["cluster.root"] == storage["cluster.root"]


ROOT_MENTION = re.compile(r"root\W{1,4}(/waltz/[\w-]+)")
# Roots that are not an example's choice: what `waltz dev` creates, and the Helm chart's (named after its release).
GENERATED_ROOTS = {"/waltz/dev", "/waltz/REL-waltz"}


def documents() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "config").glob("*.yaml"))]
    files += sorted((ROOT / "examples").glob("*.py"))
    return [*files, ROOT / "clients/python/waltz_cli/main.py", ROOT / "clients/python/waltz_client/demo/bank.py"]


def test_examples_and_docs_name_one_cluster_root():
    found = {m: path.name for path in documents() for m in ROOT_MENTION.findall(path.read_text())}
    chosen = set(found) - GENERATED_ROOTS
    assert chosen == {"/waltz/my_cluster"}, found
    assert yaml.safe_load(EXAMPLES["storage"].read_text())["cluster.root"] == "/waltz/my_cluster"


def test_no_text_names_a_waltz_storage_add_command():
    """The command is `waltz storage add-node`; `waltz storage add` does not exist."""
    wrong = re.compile(r"storage add(?![-\w])")
    files = [*documents(), *sorted((ROOT / "services").rglob("*.py")), *sorted((ROOT / "clients").rglob("*.py"))]
    assert [str(p.relative_to(ROOT)) for p in files if wrong.search(p.read_text())] == []
