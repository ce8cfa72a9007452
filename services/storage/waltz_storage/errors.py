"""Typed exceptions of the storage engine, grouped so a service can map each group to one gRPC status."""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error the storage engine raises on purpose."""


class StorageDirectoryInUse(StorageError):
    """Another open ControlFile (this process or another) holds the directory's lock."""


# --- On-disk data that is damaged or not what it should be (DATA_LOSS / INTERNAL) ---


class CorruptionError(StorageError):
    """Bytes on disk do not decode to what the format promises."""


class ChecksumError(CorruptionError):
    """A stored CRC32 does not match the bytes it covers."""


class TornRecordError(CorruptionError):
    """A record runs past the end of the available bytes (an interrupted write)."""


class TransactionIdMismatch(CorruptionError):
    """A record carries another transaction id than its position says."""


class PartitionInfoCorrupted(CorruptionError):
    """Both partition info structs of a partition fail their checksum."""


# --- The request does not fit the storage's state (FAILED_PRECONDITION) ---


class PreconditionFailed(StorageError):
    """The request is well formed but the storage's state does not allow it."""


class ClusterKeyMismatch(PreconditionFailed):
    """The cluster key given differs from the one recorded on disk."""


class PartitionCountMismatch(PreconditionFailed):
    """The number of partitions given differs from the one in the control file."""


class PartitionNotAssigned(PreconditionFailed):
    """The partition is not assigned to this storage node."""


class PartitionNotReadable(PreconditionFailed):
    """The partition is marked unreadable by an admin."""


class PartitionNotWritable(PreconditionFailed):
    """The partition is marked unwritable by an admin."""


class StaleSession(PreconditionFailed):
    """The request's session id is lower than one the partition has already seen."""


class DirtyDataError(PreconditionFailed):
    """Setting a low-water mark below the partition's max transaction id (truncate first)."""


# --- The request itself is malformed (INVALID_ARGUMENT) ---


class InvalidRequest(StorageError):
    """The request carries values the storage never accepts."""


class UnknownPartition(InvalidRequest):
    """A partition id outside 0..N-1."""


class NonConsecutiveTransactionId(InvalidRequest):
    """Appended transaction ids do not continue the partition densely."""


class DataChecksumMismatch(InvalidRequest):
    """An appended record's checksum is not the CRC32 of its data."""


class RecordTooLarge(InvalidRequest):
    """An appended record's data exceeds the configured maximum."""


class BatchTooLarge(InvalidRequest):
    """An append batch's encoded size exceeds the configured maximum."""


# --- The caller may not do this, or it would lose committed data ---


class PermissionDenied(StorageError):
    """The caller's role does not allow the request (an operator's online write, under mutual TLS)."""


class CommittedDataError(PreconditionFailed):
    """The request would remove or disown committed transactions (a truncate below the committed floor)."""
