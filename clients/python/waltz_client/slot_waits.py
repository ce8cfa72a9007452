"""A partition's submits waiting for a pending-append slot: handed one in turn (first come, first served) as slots
come free, failed together with the partition's error, timed out oldest first by one timer. ClientPartition's, split
out as a mixin (the state is the partition's, declared here for the type checker); the queue's decisions are
SlotQueue's.

A waiter's future ends with None (its slot) or the error it must raise, never with set_exception: a future holding
an exception, and the traceback of that exception holding the waiting frame (and so the future), is a reference
cycle per failed waiter, left to the cyclic collector; under overload (thousands of time-outs a second) that was
13 objects per time-out and about a fifth of the client's CPU in collections."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from waltz_client.errors import ApplyError, WaltzTimeoutError
from waltz_client.monitor import TransactionMonitor
from waltz_client.partition_env import PartitionEnv, PendingAppend
from waltz_client.slot_queue import SlotQueue


class SlotWaits:
    """ClientPartition's slot waiting (a mixin)."""

    partition_id: int
    env: PartitionEnv
    monitor: TransactionMonitor[PendingAppend]
    error: BaseException | None
    apply_failure: tuple[int, BaseException] | None
    slots: SlotQueue[asyncio.Future[BaseException | None]]
    _slot_timer: asyncio.TimerHandle | None
    _slot_timer_at: float

    if TYPE_CHECKING:
        @property
        def mounted(self) -> bool: ...

        def try_acquire_slot(self) -> bool: ...

        def release_slot(self) -> None: ...

        def mount_wait_reason(self) -> str: ...

    async def acquire_slot(self) -> None:
        """Take a pending slot, waiting in turn (first come, first served) until one is free and the partition is
        mounted. WaltzTimeoutError, oldest first, after client.requestTimeout (client.mountTimeout while not
        mounted); the partition's error at once if it fails or the client closes."""
        if self.try_acquire_slot():
            return
        if self.error is not None:
            raise self.error
        loop = self.env.loop or asyncio.get_running_loop()
        waiter: asyncio.Future[BaseException | None] | None = loop.create_future()
        assert waiter is not None
        slots = self.slots
        slots.wait(waiter, loop.time())
        if slots.free(self.monitor.pending_count()):
            self._grant()  # (a queue whose waiters all gave up meanwhile, after a remount)
        self._arm_slot_timer()
        error: BaseException | None = None
        try:
            error = await waiter
        except asyncio.CancelledError:
            if not self.slots.leave(waiter) and not waiter.cancelled() and waiter.result() is None:
                self.release_slot()  # handed a slot as it was cancelled: it goes to the next in line
            waiter = None  # (the cancelled future holds the CancelledError, whose traceback holds this frame)
            raise
        if error is not None:
            try:
                raise error
            finally:
                waiter = error = None  # (the traceback holds this frame: no cycle through its locals)

    def _not_mounted_error(self) -> Exception:
        if self.apply_failure is not None:  # the mount waits for it: that is the error
            txn_id, error = self.apply_failure
            failed = ApplyError(self.partition_id, txn_id, error)
            failed.__cause__ = error
            return failed
        return WaltzTimeoutError(
            f"partition {self.partition_id} was not mounted within {self.env.config.mount_timeout_s:g} s "
            f"(client.mountTimeout): {self.mount_wait_reason()}")

    def _grant(self) -> None:
        """Hand the free slots to the waiters at the head of the queue, one each, if mounted; fail every waiter
        with the partition's error once it has one."""
        slots = self.slots
        if not slots:
            return
        if self.error is not None:
            for waiter in slots.drain():
                if not waiter.done():
                    waiter.set_result(self.error)
            return
        if not self.mounted:
            # Not mounted any more: the waiters' deadline is client.mountTimeout from now on, which may be earlier
            # than the timer armed while mounted (client.requestTimeout).
            self._arm_slot_timer()
            return
        while granted := slots.grant(self.monitor.pending_count()):
            lost = 0
            for waiter in granted:
                if waiter.done():  # cancelled, its task not run yet: it leaves, the slot goes on
                    lost += 1
                else:
                    waiter.set_result(None)
            if not lost:
                break
            slots.put_back(lost)
        if slots:
            self._arm_slot_timer()  # (mounted now: client.requestTimeout, which may be the earlier deadline)

    def _slot_timeout(self) -> float:
        config = self.env.config
        return config.request_timeout_s if self.mounted else config.mount_timeout_s

    def _arm_slot_timer(self) -> None:
        """One timer, at the oldest waiter's deadline (a later waiter's is never earlier)."""
        deadline = self.slots.deadline(self._slot_timeout())
        if deadline is None or deadline >= self._slot_timer_at:
            return  # an earlier timer is armed: it arms the next one
        if self._slot_timer is not None:
            self._slot_timer.cancel()
        self._slot_timer_at = deadline
        self._slot_timer = (self.env.loop or asyncio.get_running_loop()).call_at(deadline, self._expire_slot_waiters)

    def _expire_slot_waiters(self) -> None:
        now = max(self._slot_timer_at, (self.env.loop or asyncio.get_running_loop()).time())  # (may run early)
        self._slot_timer, self._slot_timer_at = None, float("inf")
        mounted = self.mounted
        expired = self.slots.expire(now, self._slot_timeout())
        if expired:
            # one message for the batch (each waiter raises its own error: a traceback is per raise)
            message = str(self._slot_timeout_error()) if mounted else None
            for waiter in expired:
                if not waiter.done():
                    waiter.set_result(WaltzTimeoutError(message) if message is not None else self._not_mounted_error())
        self._arm_slot_timer()

    def _slot_timeout_error(self) -> WaltzTimeoutError:
        slots = self.slots
        return WaltzTimeoutError(
            f"partition {self.partition_id}: no pending-append slot came free within "
            f"{self.env.config.request_timeout_s:g} s (client.requestTimeout): the {slots.capacity} slots "
            f"(client.maxConcurrentTransactions) are held by {self.monitor.pending_count()} pending appends and "
            f"{slots.reserved} submits being executed, and {len(slots)} more submits wait")
