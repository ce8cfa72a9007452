"""What background scrubbing costs a storage node: CPU per MiB of records checked, next to the read path's.

    .venv/bin/python -m bench.scrub_bench [--mib N]

For records of 100 B, 1 KB and 10 KB of data, fills one partition with about N MiB (default 20), then in the same
run measures (CPU seconds of this process):
- baseline: reading every record the way a catch-up or feed read does (StoragePartition.record_fields, checksums
  verified), 1 MiB per call;
- scrub: StoragePartition.scrub over the same records, 1 MiB per step (what waltz_storage.scrubber runs on the
  partition's thread at storage.scrub.bytesPerSecond).
Prints MiB per CPU second for both, their ratio, and the share of one core that scrubbing at the default rate
takes. Asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

from waltz_common.types import Record, ReqId, crc32
from waltz_storage.config import STORAGE_KEYS
from waltz_storage.partition import StoragePartition
from waltz_storage.storage_manager import StorageManager

STEP = 1 << 20
MIB = 1 << 20


def default_rate() -> int:
    return int(next(k.default for k in STORAGE_KEYS if k.name == "storage.scrub.bytesPerSecond"))


def fill(partition: StoragePartition, data_size: int, total: int) -> None:
    n = total // (data_size + 40)
    data = bytes(range(256)) * (data_size // 256 + 1)
    for start in range(0, n, 1000):
        records = []
        for txn in range(start, min(n, start + 1000)):
            body = data[txn % 256 : txn % 256 + data_size]
            records.append(Record(txn, ReqId(1, 1, 0, txn), 0, body, crc32(body)))
        partition.append(records)


def read_all(partition: StoragePartition) -> int:
    txn, size = 0, 0
    while True:
        got = partition.record_fields(txn, 10_000, STEP)
        if not got:
            return size
        size += sum(len(fields[6]) + 40 for fields in got)
        txn += len(got)


def scrub_all(partition: StoragePartition) -> int:
    txn, size = 0, 0
    while True:
        txn, got, _ = partition.scrub(txn, STEP)
        size += got
        if txn == 0:
            return size


def cpu(fn: object, partition: StoragePartition) -> tuple[float, int]:
    started = time.process_time()
    size = fn(partition)  # type: ignore[operator]
    return time.process_time() - started, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=20, help="MiB of records per record size")
    args = parser.parse_args()
    rate = default_rate()
    rows = []
    for data_size in (100, 1000, 10_000):
        with tempfile.TemporaryDirectory() as directory, StorageManager(Path(directory), uuid.uuid4(), 1) as manager:
            partition = manager.assign(0)
            fill(partition, data_size, args.mib * MIB)
            read_s, read_bytes = cpu(read_all, partition)
            scrub_s, scrub_bytes = cpu(scrub_all, partition)
            read_speed = read_bytes / MIB / read_s
            scrub_speed = scrub_bytes / MIB / scrub_s
            core = rate / MIB / scrub_speed * 100
            rows.append((data_size, scrub_bytes / MIB, read_speed, scrub_speed, scrub_speed / read_speed, core))
    print(f"scrubbing cost (this process's CPU time; default storage.scrub.bytesPerSecond = {rate / MIB:g} MiB/s)")
    print(f"{'record data':>12} {'MiB':>6} {'read MiB/cpu-s':>15} {'scrub MiB/cpu-s':>16} {'scrub/read':>11} "
          f"{'core at default':>16}")
    for size, mib, read_speed, scrub_speed, ratio, core in rows:
        print(f"{size:>10} B {mib:>6.1f} {read_speed:>15.0f} {scrub_speed:>16.0f} {ratio:>10.2f}x {core:>15.1f}%")


if __name__ == "__main__":
    main()
