"""The server interceptor every Waltz gRPC port runs (PortGuard): the certificate's role under mutual TLS,
limits on the streams of one connection and on the connections of the port, and plain answers to requests
that do not decode.

What a caller sees:
- a certificate without the port's (or the method's) role: PERMISSION_DENIED naming the role needed;
- a call beyond the limits: RESOURCE_EXHAUSTED naming the limit (its configuration key);
- a request whose bytes are not the method's message: INVALID_ARGUMENT naming the message type, never a
  Python class or a stack frame; the process logs one WARNING line per such request;
- a fault of the process itself (an exception the service did not turn into a status): INTERNAL with a plain
  message; the traceback goes to the process's log only.

The limits, a connection being a peer address (host:port):
- streams per connection: the streaming calls a connection has open (the client Stream, ReadTransactions,
  a storage Session: they live as long as the client likes, and an idle one costs the server tens of KB).
  Unary calls end by themselves and are not refused: beyond the HTTP/2 limit the server announces
  (transport_options: this limit + UNARY_HEADROOM concurrent calls of any kind) a gRPC client holds them
  until others end, so a burst of reads waits instead of failing.
- connections: the connections with calls open. gRPC tells an application nothing of connections without
  calls; it closes connections beyond this limit + CONNECTIONS_HEADROOM itself, as they are accepted (the
  client sees UNAVAILABLE). The headroom lets probes and idle channels in, and a call just over the limit
  reach this interceptor, to be refused with a message instead of being cut.
Health checks are never refused (probes must get through) and not counted.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from waltz_common.config import Config, ConfigError, Integer, Key
from waltz_common.tls import refusal, roles_of

log = logging.getLogger(__name__)

HEALTH_SERVICE = "/grpc.health.v1.Health/"
REFLECTION_SERVICES = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")
OPEN_SERVICES = (HEALTH_SERVICE, *REFLECTION_SERVICES)
"""Services any certificate of the cluster may call (probes, grpcurl): they reveal nothing and change nothing."""

UNARY_HEADROOM = 1000
"""Calls of one connection gRPC starts beyond its streams limit: room for unary calls, and for streams over
the limit to reach the interceptor and be refused with a message; a gRPC client holds more unstarted."""

CONNECTIONS_HEADROOM = 64
"""Connections gRPC accepts beyond the limit (probes, idle channels, and the calls to refuse with a message);
it closes more at accept (the client sees UNAVAILABLE)."""

WARNING_INTERVAL_S = 10.0
"""Refusals for the limits are logged at most this often (with the count since), not one line per call."""

DEFAULT_MAX_STREAMS_PER_CONNECTION = 100
DEFAULT_MAX_CONNECTIONS = 1000

REASONS = ("streams_per_connection", "connections")

LIMIT = Integer(1, 1_000_000)
"""The range of both limits (LimitSettings checks it again for settings made without a configuration)."""


def limit_keys(prefix: str, port: str) -> tuple[Key, Key]:
    """The two configuration keys of a process's limits (prefix: server or storage)."""
    return (
        Key(f"{prefix}.maxStreamsPerConnection", LIMIT, DEFAULT_MAX_STREAMS_PER_CONNECTION,
            f"streaming calls one connection may have open at once on {port}; more are refused RESOURCE_EXHAUSTED. "
            f"An open stream costs tens of KB (an idle client Stream of a server about 35 KB): this times "
            f"{prefix}.maxConnections bounds their memory. "
            f"Unary calls are not refused: the server lets a connection run this many + {UNARY_HEADROOM} calls of "
            f"any kind at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS) and gRPC clients hold more until some end"),
        Key(f"{prefix}.maxConnections", LIMIT, DEFAULT_MAX_CONNECTIONS,
            f"connections with calls open that {port} serves at once; calls on more are refused "
            f"RESOURCE_EXHAUSTED (health checks excepted), and gRPC closes connections beyond this number "
            f"+ {CONNECTIONS_HEADROOM} as they are made"),
    )


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """A port's limits, and the configuration keys they come from (named in refusals)."""

    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    prefix: str = "server"

    def __post_init__(self) -> None:
        for name, value in (
            (f"{self.prefix}.maxStreamsPerConnection", self.max_streams_per_connection),
            (f"{self.prefix}.maxConnections", self.max_connections),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
                raise ConfigError(f"{name} must be an integer from 1 to 1000000, not {value!r}")

    @staticmethod
    def from_config(config: Config | Mapping[str, Any], prefix: str) -> LimitSettings:
        return LimitSettings(
            config[f"{prefix}.maxStreamsPerConnection"], config[f"{prefix}.maxConnections"], prefix
        )

    def transport_options(self) -> list[tuple[str, int]]:
        """gRPC server options bounding what the interceptor does not refuse (module docstring)."""
        return [
            ("grpc.max_concurrent_streams", self.max_streams_per_connection + UNARY_HEADROOM),
            ("grpc.max_allowed_incoming_connections", self.max_connections + CONNECTIONS_HEADROOM),
        ]


class CallLimits:
    """The calls open on one port by connection (peer address), and what was refused. Pure: admit and release
    are called by the interceptor on the event loop; a metrics scrape reads the counts from another thread
    (plain ints and a dict whose keys never change: safe under the GIL)."""

    def __init__(self, settings: LimitSettings) -> None:
        self.settings = settings
        self._open: dict[str, list[int]] = {}  # peer -> [calls, streaming calls]
        self.calls = 0
        self.streams = 0
        self.refused = dict.fromkeys(REASONS, 0)
        self.undecodable = 0

    @property
    def connections(self) -> int:
        return len(self._open)

    def admit(self, peer: str, streaming: bool) -> tuple[str, str] | None:
        """Count a new call of peer (streaming: a stream, which the per-connection limit counts); or, over a
        limit, (reason, message) and nothing counted."""
        s = self.settings
        counts = self._open.get(peer)
        if counts is None and len(self._open) >= s.max_connections:
            self.refused["connections"] += 1
            return "connections", (
                f"this server has calls open on {len(self._open)} connections, the most {s.prefix}.maxConnections "
                f"allows: retry later"
            )
        if streaming and counts is not None and counts[1] >= s.max_streams_per_connection:
            self.refused["streams_per_connection"] += 1
            return "streams_per_connection", (
                f"this connection has {counts[1]} streams open, the most {s.prefix}.maxStreamsPerConnection "
                f"allows: end some before opening more"
            )
        if counts is None:
            counts = self._open[peer] = [0, 0]
        counts[0] += 1
        self.calls += 1
        if streaming:
            counts[1] += 1
            self.streams += 1
        return None

    def release(self, peer: str, streaming: bool) -> None:
        """A call admitted for peer ended."""
        counts = self._open[peer]
        counts[0] -= 1
        self.calls -= 1
        if streaming:
            counts[1] -= 1
            self.streams -= 1
        if not counts[0]:
            del self._open[peer]


class LimitMetrics(Collector):
    """What the limits see on one or more ports, read at each scrape: {prefix}_streams and {prefix}_calls (open),
    {prefix}_connections (with calls open), {prefix}_calls_refused_total{reason} and
    {prefix}_requests_undecodable_total; with a port label when there are several ports."""

    def __init__(self, prefix: str, ports: Mapping[str, CallLimits], label: str | None = None) -> None:
        if label is None and len(ports) != 1:
            raise ValueError("several ports need a label to tell them apart")
        self._prefix = prefix
        self._ports = dict(ports)
        self._label = label

    def collect(self) -> Iterable[Metric]:
        p, names = self._prefix, [self._label] if self._label else []
        streams = GaugeMetricFamily(f"{p}_streams", "Streaming calls open (the limit per connection counts these)",
                                    labels=names)
        calls = GaugeMetricFamily(f"{p}_calls", "Calls open, unary and streaming, health checks excepted", labels=names)
        connections = GaugeMetricFamily(f"{p}_connections", "Connections with at least one call open", labels=names)
        refused = CounterMetricFamily(f"{p}_calls_refused", "Calls refused RESOURCE_EXHAUSTED, by the limit they "
                                      "were over: streams_per_connection or connections", labels=[*names, "reason"])
        undecodable = CounterMetricFamily(f"{p}_requests_undecodable", "Requests whose bytes did not decode as the "
                                          "method's message, refused INVALID_ARGUMENT", labels=names)
        for port, limits in self._ports.items():
            values = [port] if self._label else []
            streams.add_metric(values, limits.streams)
            calls.add_metric(values, limits.calls)
            connections.add_metric(values, limits.connections)
            for reason in REASONS:
                refused.add_metric([*values, reason], limits.refused[reason])
            undecodable.add_metric(values, limits.undecodable)
        return [streams, calls, connections, refused, undecodable]


class Undecodable(Exception):
    """A request's bytes are not the method's message. Raised by the deserializer of a request stream, out of
    the handler's read; the interceptor turns it into INVALID_ARGUMENT."""


def _message_name(deserializer: Callable[[bytes], Any]) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "the method's request message"))


def _decoding(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    name = _message_name(deserializer)

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # the parser's errors name its classes: say what is wrong plainly
            raise Undecodable(
                f"a request of {len(data)} bytes to {method} is not a valid {name}: its bytes do not decode"
            ) from None

    return decode


def _undecodable_in(exc: BaseException) -> Undecodable | None:
    """The Undecodable exc is, or that an exception group (a TaskGroup's) holds."""
    if isinstance(exc, Undecodable):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _undecodable_in(inner)
            if found is not None:
                return found
    return None


def _grpc_errors_only(exc: BaseException) -> bool:
    """Whether exc is gRPC's own (an abort: the status is sent), or a group of only such."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_grpc_errors_only(inner) for inner in exc.exceptions)
    return isinstance(exc, grpc.aio.BaseError)


class PortGuard(grpc.aio.ServerInterceptor):
    """Role check (mutual TLS), limits and plain decode errors for every call of one port (module docstring).

    roles: who may call the port (None: no TLS, no check); method_roles: methods that need a narrower role
    (full method names, e.g. /waltz.v1.WaltzServer/GetServerPartitions); limits: None for none.
    """

    def __init__(
        self,
        port: str,
        roles: Iterable[str] | None = None,
        method_roles: Mapping[str, Iterable[str]] | None = None,
        limits: CallLimits | None = None,
    ) -> None:
        self.port = port
        self.roles = frozenset(roles) if roles is not None else None
        self.method_roles = {m: frozenset(r) for m, r in (method_roles or {}).items()}
        self.limits = limits
        self._refusals_unlogged = 0
        self._last_refusal_log = float("-inf")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self._wrap(handler, handler_call_details.method)

    # ------------------------------------------------------------------ checks

    async def _enter(self, method: str, streaming: bool, context: grpc.aio.ServicerContext) -> str | None:
        """Role check and limits before the behaviour; the peer counted (to release), None if not counted."""
        allowed = self.method_roles.get(method, self.roles)
        if allowed is not None and not method.startswith(OPEN_SERVICES):
            pems = context.auth_context().get("x509_pem_cert") or []
            held = roles_of(pems[0]) if pems else frozenset()
            where = self.port if method not in self.method_roles else f"{self.port}'s {method.rsplit('/', 1)[-1]}"
            denied = refusal(where, allowed, held)
            if denied is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied)
        if self.limits is None or method.startswith(HEALTH_SERVICE):
            return None
        peer = context.peer()
        refused = self.limits.admit(peer, streaming)
        if refused is not None:
            self._log_refusal(peer, method, refused[1])
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused[1])
        return peer

    def _leave(self, peer: str | None, streaming: bool) -> None:
        if peer is not None and self.limits is not None:
            self.limits.release(peer, streaming)

    def _log_refusal(self, peer: str, method: str, message: str) -> None:
        self._refusals_unlogged += 1
        now = time.monotonic()
        if now - self._last_refusal_log < WARNING_INTERVAL_S:
            return
        log.warning("%s: refused %d calls RESOURCE_EXHAUSTED since the last such line; the latest, %s from %s: %s",
                    self.port, self._refusals_unlogged, method, peer, message)
        self._refusals_unlogged = 0
        self._last_refusal_log = now

    async def _answer_failure(self, exc: Exception, method: str, context: grpc.aio.ServicerContext) -> None:
        """A call that raised exc: INVALID_ARGUMENT and one WARNING line (no traceback) when exc is (or holds) an
        Undecodable; gRPC's own errors (an abort) as they are; anything else is a fault of this process: its
        traceback to the log, and INTERNAL with a plain message to the caller (gRPC would answer UNKNOWN with the
        exception's class name)."""
        bad = _undecodable_in(exc)
        if bad is not None:
            if self.limits is not None:
                self.limits.undecodable += 1
            log.warning("%s: %s (from %s): refused INVALID_ARGUMENT", self.port, bad, context.peer())
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(bad))
        if _grpc_errors_only(exc):
            raise exc
        log.error("%s: %s failed unexpectedly", self.port, method, exc_info=exc)
        try:
            await context.abort(
                grpc.StatusCode.INTERNAL, f"an unexpected error in {method} on the {self.port}; its log has the details"
            )
        except grpc.aio.AbortError:
            raise
        except Exception:  # the call is over already (the client went away): nothing more to tell
            raise exc from None

    # ------------------------------------------------------------------ the wrapped handler

    def _wrap(self, handler: Any, method: str) -> grpc.RpcMethodHandler:
        kind = next((k for k in _KINDS if getattr(handler, k) is not None), None)
        if kind is None:
            return handler
        behaviour = getattr(handler, kind)
        parse = handler.request_deserializer
        # gRPC decodes a unary request before any interceptor code runs and answers a failure UNKNOWN with the
        # parser's class name: such a handler takes the bytes, and they are decoded in the call (decode). A
        # request stream is decoded as it is read, by a deserializer raising Undecodable.
        decode = _decoding(parse, method) if parse is not None and not handler.request_streaming else None
        deserializer = _decoding(parse, method) if parse is not None and decode is None else None
        streaming = bool(handler.request_streaming or handler.response_streaming)

        async def prepare(request: Any, context: grpc.aio.ServicerContext) -> tuple[Any, str | None]:
            peer = await self._enter(method, streaming, context)
            if decode is None:
                return request, peer
            try:
                return decode(request), peer
            except Undecodable as exc:
                self._leave(peer, streaming)
                await self._answer_failure(exc, method, context)
                raise AssertionError("unreachable: abort raises") from None

        if inspect.isasyncgenfunction(behaviour):

            async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                request, peer = await prepare(request, context)
                try:
                    async for item in behaviour(request, context):
                        yield item
                except Exception as exc:
                    await self._answer_failure(exc, method, context)
                finally:
                    self._leave(peer, streaming)

            wrapped: Any = streamed
        else:

            async def called(request: Any, context: grpc.aio.ServicerContext) -> Any:
                request, peer = await prepare(request, context)
                try:
                    result = behaviour(request, context)
                    return await result if inspect.isawaitable(result) else result
                except Exception as exc:
                    await self._answer_failure(exc, method, context)
                finally:
                    self._leave(peer, streaming)

            wrapped = called
        make = _KINDS[kind]
        return make(wrapped, request_deserializer=deserializer, response_serializer=handler.response_serializer)


_KINDS: dict[str, Callable[..., grpc.RpcMethodHandler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}
