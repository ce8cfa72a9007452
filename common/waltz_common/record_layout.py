"""The byte layout of a transaction record in a storage data file (on-disk-format.txt, "Transaction Record").

The storage node writes records in this layout, and the Waltz server sends its appends already in it
(StorageAppendRequest.encoded_records), so both ends share these definitions.
"""

from __future__ import annotations

import struct

RECORD_PREFIX = struct.Struct(">q4iiii")
"""transaction id, ReqId (client id, generation, partition id, seq num), header, data length, data checksum"""
RECORD_PREFIX_SIZE = RECORD_PREFIX.size
RECORD_CRC = struct.Struct(">I")
"""After the data: the CRC-32 of the prefix and the data, unsigned."""
RECORD_OVERHEAD = RECORD_PREFIX_SIZE + RECORD_CRC.size
"""A record's size on disk is its data length plus this."""

assert RECORD_PREFIX_SIZE == 36
