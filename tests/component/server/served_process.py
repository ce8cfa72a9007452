"""`python -m tests.component.server.served_process STREAMS CONNECTIONS`: the grpc_harness server in a process of
its own (for measuring its memory apart from its clients), with those limits; prints its port, serves until stdin
closes."""

from __future__ import annotations

import asyncio
import sys

from waltz_common.port_guard import CallLimits, LimitSettings

from .grpc_harness import served


async def main(streams: int, connections: int) -> None:
    async with served(limits=CallLimits(LimitSettings(streams, connections))) as s:
        print(s.port, flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
