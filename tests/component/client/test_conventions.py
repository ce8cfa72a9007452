"""The client as a Python library: one exception tree with `retriable`, configuration errors that suggest the
key meant, seconds keys (old millisecond keys deprecated), WALTZ_* environment variables, a WARNING per failed
connection attempt then UnavailableError, lazy ZooKeeper, submit_and_wait (sync and async), py.typed."""

from __future__ import annotations

import builtins
import inspect
import logging
import re
import socket
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest

import waltz_client
from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, client, run
from waltz.v1 import server_pb2
from waltz_client import (
    AsyncWaltzClient,
    ConfigError,
    MockServer,
    UnavailableError,
    WaltzClient,
    WaltzError,
    WaltzTimeoutError,
    errors,
)
from waltz_client.config import CLIENT_KEYS, DEPRECATED_MS_KEYS, ClientConfig, env_name
from waltz_client.connection import ServerConnection
from waltz_client.driver import ServerStream
from waltz_client.errors import StreamClosedError

ROOT = Path(__file__).resolve().parents[3]


def test_every_client_error_is_a_waltz_error_with_a_documented_retriable_flag() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, Exception)
               and c.__module__ == errors.__name__]
    assert {c.__name__ for c in classes} >= {"ConfigError", "UnavailableError", "WaltzTimeoutError"}
    for cls in classes:
        assert issubclass(cls, WaltzError), cls
        assert isinstance(cls.__dict__.get("retriable", WaltzError.retriable), bool), cls
    assert UnavailableError.retriable and WaltzTimeoutError.retriable and not ConfigError.retriable
    assert issubclass(ConfigError, ValueError)  # what `except ValueError` caught before still catches it
    for name in ("ConfigError", "UnavailableError"):
        assert name in waltz_client.__all__ and getattr(waltz_client, name) is getattr(errors, name)
    assert "retriable" in (errors.__doc__ or "")


def test_configuration_errors_are_waltz_errors_and_suggest_the_key_meant() -> None:
    with pytest.raises(ConfigError, match=r"client\.mountTimout \(did you mean client\.mountTimeout\?\)"):
        ClientConfig.of({"client.mountTimout": 5}, zookeeper_required=False)
    with pytest.raises(WaltzError, match=r"did you mean client\.maxRetries\?"):
        ClientConfig.of({"client": {"maxretries": 5}}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"client\.maxBatchSize: 0 is out of range \(at least 1\)"):
        ClientConfig.of({"client.maxBatchSize": 0}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"client\.mountTimeout: 'soon' is not a number"):
        ClientConfig.of({"client.mountTimeout": "soon"}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"client\.maxConcurrentTransactions: 2\.5 is not an integer"):
        ClientConfig.of({"client.maxConcurrentTransactions": 2.5}, zookeeper_required=False)
    with pytest.raises(ConfigError, match="does not exist"):
        ClientConfig.of("/nonexistent/client.yaml")


def test_durations_are_seconds_and_the_old_millisecond_keys_still_work_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    config = ClientConfig.of({"client.discoveryIntervalSeconds": 0.5, "client.longWaitThresholdSeconds": 2,
                              "client.keepaliveTimeSeconds": 30}, zookeeper_required=False)
    assert (config.discovery_interval_s, config.long_wait_threshold_s, config.keepalive_time_s) == (0.5, 2.0, 30.0)
    in_ms = [k.name for k in CLIENT_KEYS if k.name not in DEPRECATED_MS_KEYS and ("ms " in k.doc or "milli" in k.doc)]
    assert in_ms == []
    with pytest.warns(DeprecationWarning) as warned:
        old = ClientConfig.of({"client.discoveryInterval": 250, "client.longWaitThreshold": 1500,
                               "client.keepaliveTime": 20000}, zookeeper_required=False)
    assert sorted(str(w.message).split()[2] for w in warned) == sorted(DEPRECATED_MS_KEYS)
    assert "client.longWaitThreshold (milliseconds) is deprecated: use client.longWaitThresholdSeconds" in str(
        warned[1].message)
    assert (old.discovery_interval_s, old.long_wait_threshold_s, old.keepalive_time_s) == (0.25, 1.5, 20.0)
    assert any(r.levelno == logging.WARNING and "client.keepaliveTimeSeconds" in r.getMessage() for r in caplog.records)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keys alone warn of nothing
        ClientConfig.of({"client.keepaliveTimeSeconds": 10}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"set client\.keepaliveTimeSeconds \(seconds\) only"):
        ClientConfig.of({"client.keepaliveTime": 1000, "client.keepaliveTimeSeconds": 1}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"client\.discoveryIntervalSeconds: 0 is out of range \(above 0\)"):
        ClientConfig.of({"client.discoveryIntervalSeconds": 0}, zookeeper_required=False)
    with pytest.raises(ConfigError, match=r"client\.keepaliveTime: 0 is out of range \(at least 1\)"):
        ClientConfig.of({"client.keepaliveTime": 0}, zookeeper_required=False)


def test_every_key_comes_from_a_waltz_variable_and_the_configuration_wins_over_it() -> None:
    assert env_name("client.servers") == "WALTZ_CLIENT_SERVERS"
    assert env_name("client.mountTimeout") == "WALTZ_CLIENT_MOUNT_TIMEOUT"
    assert env_name("zookeeper.connectString") == "WALTZ_ZOOKEEPER_CONNECT_STRING"
    assert env_name("tls.caFile") == "WALTZ_TLS_CA_FILE"
    environ = {"WALTZ_CLIENT_SERVERS": "a:1,b:2", "WALTZ_CLIENT_MOUNT_TIMEOUT": "7.5", "WALTZ_CLIENT_AUTO_MOUNT": "no",
               "WALTZ_SLOW": "1", "WALTZ_CLIENT_MAX_RETRIES": ""}  # other tools' variables and empty ones: ignored
    from_env = ClientConfig.of(None, environ=environ)  # no configuration at all: the environment is enough
    assert from_env.servers == ("a:1", "b:2") and from_env.mount_timeout_s == 7.5 and from_env.auto_mount is False
    assert from_env.max_retries == -1
    given = ClientConfig.of({"client.mountTimeout": 3}, environ=environ)
    assert given.mount_timeout_s == 3.0 and given.servers == ("a:1", "b:2")  # the configuration wins, env fills in
    with pytest.raises(ConfigError, match=r"WALTZ_CLIENT_MOUNT_TIMEOUT: 'later' is not a number"):
        ClientConfig.of({"client.servers": "a:1"}, environ={"WALTZ_CLIENT_MOUNT_TIMEOUT": "later"})
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert "WALTZ_CLIENT_SERVERS" in doc and "Precedence" in doc


def test_an_unknown_waltz_client_variable_warns_once_naming_the_closest_and_does_not_stop_the_client(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waltz_client.config, "_warned", set())  # as in a fresh process
    caplog.set_level(logging.WARNING, logger="waltz_client.config")
    environ = {"WALTZ_CLIENT_SERVRES": "b:1", "WALTZ_CLIENT_YAML": "app.yaml"}  # an application's own, and a typo
    config = ClientConfig.of({"client.servers": "a:1"}, environ=environ)
    assert config.servers == ("a:1",)
    ClientConfig.of({"client.servers": "a:1"}, environ=environ)  # a second client: no second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert ("environment: WALTZ_CLIENT_SERVRES names no client configuration key; ignored (did you mean "
            "WALTZ_CLIENT_SERVERS?)") in warnings
    assert any(w.startswith("environment: WALTZ_CLIENT_YAML names no client configuration key; ignored")
               for w in warnings)


def test_waltz_client_config_names_the_yaml_file_of_a_client_given_none(tmp_path: Path) -> None:
    path = tmp_path / "client.yaml"
    path.write_text("client.servers: f:1\nclient.mountTimeout: 4\n")
    environ = {"WALTZ_CLIENT_CONFIG": str(path), "WALTZ_CLIENT_REQUEST_TIMEOUT": "9"}
    config = ClientConfig.of(None, environ=environ)
    assert config.servers == ("f:1",) and config.mount_timeout_s == 4.0 and config.request_timeout_s == 9.0
    overridden = ClientConfig.of(None, environ=environ, overrides={"client.mountTimeout": 6})
    assert overridden.servers == ("f:1",) and overridden.mount_timeout_s == 6.0
    given = ClientConfig.of({"client.servers": "g:1"}, environ=environ)  # a configuration given: the file is not read
    assert given.servers == ("g:1",) and given.mount_timeout_s == 10.0
    with pytest.raises(ConfigError, match=r"WALTZ_CLIENT_CONFIG=.*nothing\.yaml: no such file"):
        ClientConfig.of(None, environ={"WALTZ_CLIENT_CONFIG": str(tmp_path / "nothing.yaml")})




def _dead_address() -> str:
    with socket.socket() as s:  # a port nothing listens on (closed again at once)
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_no_server_answering_is_a_warning_per_attempt_then_unavailable_error(caplog: pytest.LogCaptureFixture) -> None:
    address = _dead_address()
    caplog.set_level(logging.WARNING, logger="waltz_client")

    async def start() -> None:
        async with AsyncWaltzClient(MemoryCallbacks(), {"client.servers": address, "client.requestTimeout": 1.5}):
            pass

    with pytest.raises(UnavailableError, match=rf"no Waltz server answered GetClusterInfo within 1.5 s.*{address}") \
            as raised:
        run(start())
    assert raised.value.retriable
    attempts = [r for r in caplog.records if r.levelno == logging.WARNING and address in r.getMessage()]
    assert len(attempts) >= 2, [r.getMessage() for r in caplog.records]  # from the first failure on, not at the end
    assert "UNAVAILABLE" in attempts[0].getMessage() and "trying again" in attempts[0].getMessage()


def test_zookeeper_discovery_without_kazoo_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_kazoo(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "kazoo" or name.startswith("kazoo."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_kazoo)
    root = re.escape(str(ROOT))  # the checkout this install came from: a command that works
    with pytest.raises(ConfigError, match=rf"pip install -e '{root}\[zookeeper\]', or set client\.servers"):
        AsyncWaltzClient(MemoryCallbacks(), {"zookeeper.connectString": "127.0.0.1:1", "cluster.root": "/w"})


def test_submit_and_wait_returns_the_outcome_sync_and_async() -> None:
    server = MockServer(2)

    async def main() -> None:
        async with client(server) as c:
            assert await c.submit_and_wait(Ctx(b"one", partition=1)) is True
            assert await c.submit_and_wait(Ctx(b"no", result=False)) is False
            server.hold_requests()
            with pytest.raises(WaltzTimeoutError, match="goes on"):
                await c.submit_and_wait(Ctx(b"held"), timeout=0.2)
            server.release_requests()
            await c.flush()

    run(main())
    assert [r.data for r in server.records(0)] == [b"held"]
    server = MockServer(1)  # a new log: this client applies only what it wrote (no fetch, in either callback mode)
    with WaltzClient(MemoryCallbacks(), FAST, driver=server) as blocking:
        assert blocking.submit_and_wait(Ctx(b"two"), timeout=30) is True
        assert blocking.submit_and_wait(Ctx(b"skip", result=False)) is False
        server.hold_requests()
        with pytest.raises(WaltzTimeoutError):
            blocking.submit_and_wait(Ctx(b"held again"), timeout=0.2)
        server.release_requests()
        blocking.flush()
    assert [r.data for r in server.records(0)] == [b"two", b"held again"]


def test_the_packages_are_typed_and_ship_their_marker() -> None:
    for package in ("clients/python/waltz_client", "common/waltz_common", "common/waltz"):
        assert (ROOT / package / "py.typed").is_file(), package
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = project["tool"]["setuptools"]["package-data"]
    for package in ("waltz_client", "waltz_common", "waltz"):
        assert "py.typed" in package_data[package], package


class _RefusedStream(ServerStream):
    """A stream whose server never answers: the connection attempt itself fails."""

    async def send(self, message: server_pb2.ClientMessage) -> None:
        raise StreamClosedError("s:1: UNAVAILABLE: connection refused")

    async def receive(self) -> server_pb2.ServerMessage:
        raise StreamClosedError("s:1: UNAVAILABLE: connection refused")

    async def close(self) -> None:
        pass


def test_a_stream_that_never_opened_is_a_warning_and_one_that_ended_is_not(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="waltz_client")

    async def dispatch(conn: ServerConnection, pid: int, message: server_pb2.ServerMessage | None) -> None:
        pass

    async def both() -> None:
        await ServerConnection("s:1", _RefusedStream(), 1, 10).run(dispatch)
        ended = ServerConnection("s:1", _RefusedStream(), 2, 10)
        ended.received_any = True  # it had worked: a stream that ends is routine, the client reconnects
        await ended.run(dispatch)

    run(both())
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if "s:1" in r.getMessage()]
    assert [level for level, _ in levels] == [logging.WARNING, logging.INFO], levels
    assert "could not open a stream to Waltz server s:1" in levels[0][1]
