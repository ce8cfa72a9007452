"""Command results: human tables by default, JSON with --json, progress bars on stderr."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


@dataclass
class Result:
    """What a command produced: data for --json, text for people, and the exit code."""

    data: Any
    text: str = ""
    exit_code: int = 0

    def render(self, as_json: bool) -> str:
        if as_json:
            return json.dumps(self.data, indent=2, sort_keys=True, default=str)
        return self.text


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A left-aligned text table with a header rule; '(none)' when there are no rows."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not cells:
        return "(none)"
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ranges(sorted(value)) if all(isinstance(v, int) for v in value) else ", ".join(map(str, value))
    return str(value)


def ranges(ids: Sequence[int]) -> str:
    """[0,1,2,3,5] -> '0-3,5', the CLI's own partition-range syntax; '-' when empty."""
    if not ids:
        return "-"
    parts: list[str] = []
    start = prev = ids[0]
    for value in [*ids[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def data_text(data: bytes, limit: int | None = None) -> str:
    """Transaction data for people: printable UTF-8 as is, anything else as 0x-hex; cut at limit characters."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if not (text and text.isprintable()):
        text = "0x" + data.hex() if data else ""
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def section(title: str, body: str) -> str:
    """A titled block of text."""
    return f"{title}\n{body}"


def progress(items: Iterable[T], total: int | None, desc: str, enabled: bool | None) -> Iterator[T]:
    """Iterate with a tqdm bar on stderr; enabled=None shows it only on a terminal."""
    show = sys.stderr.isatty() if enabled is None else enabled
    yield from tqdm(items, total=total, desc=desc, file=sys.stderr, disable=not show, leave=False, unit="it")


class Counter:
    """A tqdm bar counting units of work (records, transactions) on stderr."""

    def __init__(self, total: int | None, desc: str, enabled: bool | None, unit: str = "txn") -> None:
        show = sys.stderr.isatty() if enabled is None else enabled
        self._bar = tqdm(total=total, desc=desc, file=sys.stderr, disable=not show, leave=False, unit=unit)

    def update(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def emit_line(data: dict[str, Any], text: str, as_json: bool, out: TextIO | None = None) -> None:
    """Print one streamed item (tail): a JSON line or a text line."""
    stream = out or sys.stdout
    print(json.dumps(data, sort_keys=True, default=str) if as_json else text, file=stream, flush=True)


def reader_gone() -> None:
    """After a broken pipe on stdout: send what is left to /dev/null, so that the interpreter's last
    flush at exit does not fail again with a traceback (`Exception ignored ... BrokenPipeError`)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture): nothing will flush to a pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
