"""Talking raw gRPC to a port in tests: calls that send and receive bytes as they are, how a call ended, and a
sample of a metrics collector."""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client.registry import Collector

PYTHON_WORDS = ("<class", "DecodeError", "ExceptionGroup", "Exception", "Traceback", 'File "', ".py")
"""What a message to a caller must not contain: Python class names, stack frames."""


def raw_stream(channel: grpc.aio.Channel, method: str) -> Any:
    """A bidirectional call sending and receiving bytes (no protobuf on this side)."""
    return channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)()


def plain(details: str) -> bool:
    return not any(word in details for word in PYTHON_WORDS)


async def ended(call: Any) -> tuple[grpc.StatusCode, str]:
    """How a call ended: its code and details (after reading whatever it sent)."""
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return await call.code(), await call.details()


def sample(collector: Collector, name: str, **labels: str) -> float:
    """The value of collector's sample name with those labels."""
    for family in collector.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise KeyError(name)
