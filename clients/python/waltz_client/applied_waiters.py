"""The waits for a partition's client high-water mark to reach a transaction id (AsyncWaltzClient.wait_applied)."""

from __future__ import annotations

import asyncio
import heapq
import itertools

_PURGE_AT = 64  # waits given up (timed out, cancelled) are dropped once this many are kept, not one by one


class AppliedWaiters:
    """Futures ended once what the client applied of one partition reaches their transaction id; kept in a heap by
    that id, so that each move of the mark ends the reached ones without looking at the others."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties: futures do not compare
        self._error: BaseException | None = None

    def __bool__(self) -> bool:
        return bool(self._heap)

    def wait(self, transaction_id: int) -> asyncio.Future[None]:
        """A future that ends once reached(mark) is called with mark >= transaction_id (or with fail's error)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._error is not None:
            future.set_exception(self._error)
            return future
        if len(self._heap) >= _PURGE_AT:
            self._heap = [entry for entry in self._heap if not entry[2].done()]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (transaction_id, next(self._order), future))
        return future

    def reached(self, mark: int) -> None:
        """The client has applied the partition up to mark."""
        heap = self._heap
        while heap and heap[0][0] <= mark:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)

    def fail(self, error: BaseException) -> None:
        """The partition stopped for good: every wait, now and later, ends with error."""
        self._error = error
        for _, _, future in self._heap:
            if not future.done():
                future.set_exception(error)
        self._heap.clear()
