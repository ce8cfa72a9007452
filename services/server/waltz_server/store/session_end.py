"""Why a store session ended: the end reasons and how a failure raised by a session task maps to one."""

from __future__ import annotations

import asyncio
import logging

from kazoo.exceptions import KazooException

from waltz_server.recovery import SessionFencedError
from waltz_server.store.connection import Code, StorageError, StorageRpcError
from waltz_server.store.metadata import MetadataConflict

log = logging.getLogger(__name__)


class SessionEnded(Exception):
    """Why a store session ended."""


class SessionFailed(SessionEnded):
    """A replica failed (or the session could not go on): the next session recovers, after a backoff."""


class SessionRestart(SessionEnded):
    """A planned end: checkpoint interval reached, replicas reassigned, generation changed, store closed."""


class SessionFenced(SessionEnded):
    """A newer store session of this partition exists (storage or ZooKeeper says so)."""


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


def classify(error: BaseException) -> SessionEnded:
    """The reason a session ended, from whatever a task of it raised."""
    if isinstance(error, SessionEnded):
        return error
    if isinstance(error, SessionFencedError | MetadataConflict):
        return SessionFenced(str(error))
    if isinstance(error, StorageRpcError) and error.code == Code.STALE_SESSION:
        return SessionFenced(str(error))
    if isinstance(error, StorageError):
        return SessionFailed(str(error))
    if isinstance(error, KazooException):
        return SessionFailed(f"ZooKeeper: {type(error).__name__} {error}")
    log.error("store session task failed unexpectedly", exc_info=error)
    return SessionFailed(f"unexpected {type(error).__name__}: {error}")


def refused_by_replica(error: BaseException) -> bool:
    """Whether a replica refused the session for its fence: answered STALE_SESSION, or reported a newer session
    in its facts (SessionFencedError). A MetadataConflict is ZooKeeper's word, not a replica's."""
    stale = isinstance(error, StorageRpcError) and error.code == Code.STALE_SESSION
    return stale or isinstance(error, SessionFencedError)


def end_reason(group: BaseExceptionGroup[BaseException]) -> SessionEnded:
    reasons = [classify(e) for e in leaves(group) if not isinstance(e, asyncio.CancelledError)]
    for kind in (SessionFenced, SessionFailed, SessionRestart):
        for reason in reasons:
            if isinstance(reason, kind):
                return reason
    return reasons[0] if reasons else SessionFailed("store session ended")
