"""bench.session_port's requests (appends with consecutive transaction ids, as the node takes them) and its CPU
reading (every thread of a process, in ns)."""

import os
import threading
from pathlib import Path

from bench.session_port import Requests, node_cpu_ns
from waltz.v1 import storage_pb2
from waltz_common.record_layout import RECORD_PREFIX


def test_appends_carry_consecutive_transaction_ids_across_calls_and_kinds() -> None:
    made = Requests()
    first = [storage_pb2.StorageRequest.FromString(d).append for d in made.make("append 100", 2)]
    second = [storage_pb2.StorageRequest.FromString(d).append for d in made.make("append 1", 3)]
    opens = [storage_pb2.StorageRequest.FromString(d) for d in made.make("open", 2)]
    assert [a.record_list_length for a in first + second] == [100, 100, 1, 1, 1]
    ids = [RECORD_PREFIX.unpack_from(a.encoded_records)[0] for a in first + second]
    assert ids == [0, 100, 200, 201, 202] and made.next_id == 203
    assert all(r.WhichOneof("request") == "open" for r in opens)


def this_thread_ns() -> int:
    return int(Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat").read_text().split()[0])


def test_the_cpu_reading_counts_the_other_threads_of_the_process() -> None:
    spun, done = threading.Event(), threading.Event()

    def spin() -> None:
        sum(range(2_000_000))
        spun.set()
        done.wait(10)

    worker = threading.Thread(target=spin)
    before, mine_before = node_cpu_ns(os.getpid()), this_thread_ns()
    worker.start()
    try:
        assert spun.wait(10)
        after, mine_after = node_cpu_ns(os.getpid()), this_thread_ns()
    finally:
        done.set()
        worker.join()
    assert (after - before) - (mine_after - mine_before) > 1_000_000  # the worker's spin, some ms
