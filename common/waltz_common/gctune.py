"""Garbage-collector settings for the long-running services (server, storage node).

A server holds its recent transactions in caches: some hundred thousand protobuf messages that live
for minutes. CPython's default thresholds (700, 10, 10) run a young collection every 700 allocations
and, as the caches fill and churn, full collections that walk all of them: in a profile of the append
path that was about 30% of the server's CPU, and full collections pause the event loop for tens of
milliseconds. These messages form no reference cycles, so fewer collections lose nothing but a little
time before cyclic garbage (rare here) is freed.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Allocations between young collections (CPython's default: 700)."""
OLD_THRESHOLD = 100
"""Middle-generation collections between full ones (default: 10); CPython also waits until the objects
waiting for a full collection are a quarter of the old ones."""


def tune_for_service() -> None:
    """Set the thresholds above, and move what start-up allocated (modules, configuration) out of the
    collector's sight: it lives as long as the process."""
    gc.set_threshold(YOUNG_THRESHOLD, 10, OLD_THRESHOLD)
    gc.freeze()
