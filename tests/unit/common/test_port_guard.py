"""The limits' decision core (CallLimits) and their settings: pure, no gRPC."""

from __future__ import annotations

import pytest

from waltz_common.config import ConfigError
from waltz_common.port_guard import CONNECTIONS_HEADROOM, UNARY_HEADROOM, CallLimits, LimitMetrics, LimitSettings


def test_streams_are_limited_per_connection_and_unary_calls_are_not():
    limits = CallLimits(LimitSettings(max_streams_per_connection=2, max_connections=10))
    assert limits.admit("a:1", streaming=True) is None
    assert limits.admit("a:1", streaming=True) is None
    reason, message = limits.admit("a:1", streaming=True) or ("", "")
    assert reason == "streams_per_connection"
    assert message == (
        "this connection has 2 streams open, the most server.maxStreamsPerConnection allows: "
        "end some before opening more"
    )
    assert limits.admit("a:1", streaming=False) is None  # unary: bounded by HTTP/2, not refused
    assert limits.admit("b:1", streaming=True) is None  # another connection has its own count
    assert (limits.streams, limits.calls, limits.connections) == (3, 4, 2)
    limits.release("a:1", streaming=True)
    assert limits.admit("a:1", streaming=True) is None
    assert limits.refused == {"streams_per_connection": 1, "connections": 0}


def test_connections_are_limited_and_a_connection_is_forgotten_with_its_last_call():
    limits = CallLimits(LimitSettings(max_streams_per_connection=5, max_connections=2, prefix="storage"))
    assert limits.admit("a:1", streaming=False) is None
    assert limits.admit("b:1", streaming=True) is None
    reason, message = limits.admit("c:1", streaming=False) or ("", "")
    assert reason == "connections"
    assert "calls open on 2 connections, the most storage.maxConnections allows: retry later" in message
    assert limits.admit("a:1", streaming=True) is None  # a known connection is not a new one
    limits.release("a:1", streaming=False)
    limits.release("a:1", streaming=True)
    assert limits.connections == 1
    assert limits.admit("c:1", streaming=False) is None
    assert limits.refused == {"streams_per_connection": 0, "connections": 1}


@pytest.mark.parametrize("value", [0, -1, 1_000_001, 2.5, True, "10"])
def test_limits_must_be_sensible_integers(value):
    with pytest.raises(ConfigError, match=r"server\.maxConnections must be an integer from 1 to 1000000"):
        LimitSettings(max_connections=value)


def test_transport_options_leave_headroom_over_the_limits():
    options = dict(LimitSettings(7, 9).transport_options())
    assert options == {
        "grpc.max_concurrent_streams": 7 + UNARY_HEADROOM,
        "grpc.max_allowed_incoming_connections": 9 + CONNECTIONS_HEADROOM,
    }


def test_metrics_by_port():
    storage, admin = CallLimits(LimitSettings(prefix="storage")), CallLimits(LimitSettings(prefix="storage"))
    storage.admit("a:1", streaming=True)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in LimitMetrics("waltz_storage", {"storage": storage, "admin": admin}, label="port").collect()
        for s in family.samples
    }
    assert samples[("waltz_storage_streams", (("port", "storage"),))] == 1
    assert samples[("waltz_storage_connections", (("port", "admin"),))] == 0
    assert samples[("waltz_storage_calls_refused_total", (("port", "admin"), ("reason", "connections")))] == 0
    with pytest.raises(ValueError):
        LimitMetrics("waltz_storage", {"storage": storage, "admin": admin})
