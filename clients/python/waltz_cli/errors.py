"""CLI errors and the one-line message every failure is reduced to (no tracebacks for operators)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from waltz_common.config import ConfigError
from waltz_common.zk import MetadataError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure the operator can act on; its message is the whole story."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(CliError):
    """A wrong argument: exit code 2 like argparse."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


T = TypeVar("T")


def checked(kind: Callable[[Any], T]) -> Callable[[str], T]:
    """An argparse type from a configuration key kind (waltz_common.config.PORT, Integer(...)): its ValueError
    ("-5 is out of range (1..65535)") becomes argparse's usage error, exit 2, naming the option."""

    def parse(text: str) -> T:
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def rpc_message(exc: grpc.RpcError, what: str) -> str:
    """'what: CODE: details' for a failed gRPC call, naming what was called."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{what}: unreachable ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{what}: no answer in time"
    return f"{what}: {name}: {details}"


def one_line(exc: BaseException) -> str:
    """The message of any exception squeezed onto one line, prefixed by its kind when not ours."""
    if isinstance(exc, CliError | MetadataError | ConfigError):
        text = str(exc)
    elif isinstance(exc, grpc.RpcError):
        text = rpc_message(exc, "gRPC call failed")
    elif isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())
