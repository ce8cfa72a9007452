"""The write set's waits for a high-water mark (WriteSet.reaching), driven by acknowledgements without a network."""

from __future__ import annotations

import asyncio

from waltz.v1 import storage_pb2
from waltz_server.store.events import Signal
from waltz_server.store.write_set import Batch, WriteSet


def test_reaching_is_done_by_the_commit_that_moves_the_mark_to_it_and_not_before() -> None:
    async def main() -> None:
        progress = Signal()
        writes = WriteSet(quorum=2, progress=progress)
        writes.open(9)
        loop = asyncio.get_running_loop()

        def batch(first: int, last: int) -> Batch:
            sent = Batch(first, last, storage_pb2.StorageRequest(), b"", loop.create_future())
            writes.inflight.append(sent)
            return sent

        assert writes.reaching(9).done() and writes.reaching(-1).done()
        far, near, again = writes.reaching(20), writes.reaching(12), writes.reaching(12)
        first, second, third = batch(10, 11), batch(12, 15), batch(16, 25)
        writes._acknowledged(first)
        assert progress.version == 1 and writes.high_water_mark == 9  # one vote of two: not committed
        writes._acknowledged(first)
        assert writes.high_water_mark == 11 and not near.done() and not far.done()
        writes._acknowledged(second)
        writes._acknowledged(second)
        assert near.done() and again.done() and not far.done()
        writes._acknowledged(third)
        writes._acknowledged(third)
        assert far.done() and writes.high_water_mark == 25

    asyncio.run(main())
