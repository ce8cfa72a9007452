"""A storage node's CPU per request on its framed session port (storage.sessionPort): this checkout's port against
a baseline revision's, served by one node process at the same time.

    python -m bench.session_port [--baseline REV] [--rounds N] [--blocks N] [--block N] [--dir DIR]

One node process (uvloop, as the service runs; partition 0 assigned, its files in DIR, default /dev/shm where
there is one, so that an fdatasync costs little and the port's share shows) serves two framed session ports on the
same StorageNode: this checkout's waltz_storage.session_port and the baseline revision's session_port.py (from its
checkout under the benchmark cache, bench.revisions, loaded from its file; the rest of the node is this checkout's,
so the port is the only difference). This process opens one stream to each and sends one request at a time,
waiting for its answer (the serial chain of a 1-writer round), in blocks of --block requests that alternate between
the two ports, --blocks blocks each, and reads the node's CPU (every thread's, /proc/PID/task/*/schedstat, in ns)
around each block. Alternating blocks in one process puts both sides under the same load, which a busy machine
moves by more than the difference. Kinds of request:
- open: an Open (about 60 bytes), answered on the node's event loop: the port and the dispatch alone;
- append 1: an append of one 512 B record, the stream quiet, so the node writes it on its loop;
- append 100: an append of 100 records of 512 B (about 55 KB, a 100-writer round's request), a frame that
  arrives in several chunks.
Prints the node's CPU us per request of each side and the round trip's wall us as this process saw it (the
latency of the chain), their means over the rounds, each round's candidate/baseline ratio and the ratio of the
means.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.revisions import REPO, checkout

KEY = uuid.UUID("0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e")
KINDS = {"open": 1.0, "append 1": 0.5, "append 100": 0.2}  # requests of each kind per block, times --block
RECORD_BYTES = 512
SIDES = ("baseline", "candidate")


def node_cpu_ns(pid: int) -> int:
    """Nanoseconds of CPU every thread of the process has used so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            pass
    return total


async def serve_node(directory: Path, baseline_port_file: Path) -> None:
    """The node process: both ports on one node until stdin closes; prints their port numbers."""
    import waltz_storage
    from waltz_storage import server
    from waltz_storage.dispatch import Limits
    from waltz_storage.node import StorageNode

    spec = importlib.util.spec_from_file_location("waltz_storage.baseline_session_port", baseline_port_file)
    assert spec is not None and spec.loader is not None
    baseline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(baseline)
    node = StorageNode.open(directory, KEY, 1, limits=Limits(1 << 20, 4 << 20), segment_size_threshold=1 << 30)
    node.manager.assign(0)
    servers = await server.start(node, "127.0.0.1", 0, 0, session_port=0)
    assert servers.session is not None and servers.limits is not None
    other = baseline.SessionPort(node, None, server.STORAGE_ROLES, servers.limits["storage"], 10 << 20)
    ports = {"candidate": servers.session.port, "baseline": await other.start("127.0.0.1", 0)}
    print(json.dumps({"ports": ports, "package": str(Path(waltz_storage.__file__).parent)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await other.stop(1)
    await servers.stop(1)


class FramedPeer:
    """This side of one framed stream: one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, data: bytes) -> Any:
        from waltz.v1 import storage_pb2
        from waltz_common import frames

        frames.write_frame(self.writer, data)
        answer = await frames.read_frame(self.reader, frames.MAX_FRAME_LIMIT)
        assert answer is not None, "the node closed the stream"
        response = storage_pb2.StorageResponse.FromString(answer)
        if not response.HasField("success"):
            raise RuntimeError(f"the node refused a request: {response}")
        return response


class Requests:
    """Serialized requests of each kind; appends carry the next transaction ids (session 1, partition 0)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.data = os.urandom(RECORD_BYTES)

    def make(self, kind: str, count: int) -> list[bytes]:
        from waltz.v1 import common_pb2, storage_pb2
        from waltz_common.types import crc32
        from waltz_server.store.api import NewRecord
        from waltz_server.store.wire import append_pending_request

        if kind == "open":
            opening = storage_pb2.OpenRequest(session_id=-1, seq_num=-1, partition_id=-1, cluster_key=str(KEY),
                                              num_partitions=1)
            return [storage_pb2.StorageRequest(open=opening).SerializeToString()] * count
        per = int(kind.split()[1])
        crc = crc32(self.data)
        out = []
        for n in range(count):
            rows = [NewRecord(common_pb2.ReqId(client_id=i, generation=1, partition_id=0, seq_num=n), i & 0xFF,
                              self.data, crc) for i in range(per)]
            request = append_pending_request(1, 0, self.next_id, rows, self.next_id - 1)
            request.append.seq_num = n
            out.append(request.SerializeToString())
            self.next_id += per
        return out


async def measure(pid: int, ports: dict[str, int], blocks: int, block: int) -> dict[str, dict[str, float]]:
    """CPU us of the node per request of each kind, and wall us per round trip ("KIND, round trip"), by side (both
    sides' blocks alternating)."""
    from waltz.v1 import storage_pb2

    peers = {}
    for side in SIDES:
        peers[side] = FramedPeer(*await asyncio.open_connection("127.0.0.1", ports[side]))
    made = Requests()
    low = storage_pb2.StorageRequest()
    low.set_low_water_mark.session_id = 1
    low.set_low_water_mark.low_water_mark = -1
    await peers["candidate"].ask(made.make("open", 1)[0])
    await peers["baseline"].ask(made.make("open", 1)[0])
    await peers["candidate"].ask(low.SerializeToString())
    cpu: dict[str, dict[str, float]] = {side: {} for side in SIDES}
    for kind, share in KINDS.items():
        count = max(5, int(block * share))
        for side in SIDES:  # warm-up
            for data in made.make(kind, count):
                await peers[side].ask(data)
        spent = {side: 0 for side in SIDES}
        waited = {side: 0 for side in SIDES}
        for b in range(blocks):
            for side in SIDES if b % 2 == 0 else SIDES[::-1]:
                batch = made.make(kind, count)
                started, began = node_cpu_ns(pid), time.perf_counter_ns()
                for data in batch:
                    await peers[side].ask(data)
                waited[side] += time.perf_counter_ns() - began
                spent[side] += node_cpu_ns(pid) - started
        for side in SIDES:
            cpu[side][kind] = spent[side] / (blocks * count) / 1000
            cpu[side][f"{kind}, round trip"] = waited[side] / (blocks * count) / 1000
    for peer in peers.values():
        peer.writer.close()
    return cpu


def one_node(baseline_port_file: Path, directory: Path, blocks: int, block: int) -> dict[str, dict[str, float]]:
    command = [sys.executable, "-m", "bench.session_port", "--node", str(directory), str(baseline_port_file)]
    with subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as node:
        try:
            assert node.stdout is not None and node.stdin is not None
            started = json.loads(node.stdout.readline())
            return asyncio.run(measure(node.pid, started["ports"], blocks, block))
        finally:
            if node.stdin is not None:
                node.stdin.close()
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                node.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=3, help="node processes, one after the other")
    parser.add_argument("--blocks", type=int, default=20, help="blocks of each kind per side and round")
    parser.add_argument("--block", type=int, default=500, help="Open requests in a block (fewer of the appends)")
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the node's files are (default /dev/shm, else the temporary directory)")
    parser.add_argument("--node", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.node:
        from waltz_common import event_loop

        event_loop.run(serve_node(Path(args.node[0]), Path(args.node[1])))
        return
    revision = args.baseline or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                                               capture_output=True, text=True, check=True).stdout.strip()
    base = checkout(revision)
    port_file = base.path / "services" / "storage" / "waltz_storage" / "session_port.py"
    rounds: list[dict[str, dict[str, float]]] = []
    loads = []
    with tempfile.TemporaryDirectory(prefix="waltz-session-port-", dir=args.dir) as workdir:
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            rounds.append(one_node(port_file, Path(workdir) / f"node-{r}", args.blocks, args.block))
            print(f"round {r + 1} (load {loads[-1]:.2f}): " + "  ".join(
                f"{kind} {rounds[-1]['baseline'][kind]:.1f}/{rounds[-1]['candidate'][kind]:.1f}" for kind in KINDS
            ), file=sys.stderr, flush=True)
    print(f"storage node's CPU per request on its framed session port (both ports in one node, blocks of requests "
          f"alternating), {args.rounds} rounds; load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"baseline: {revision} = {base.commit[:12]}'s session_port.py; candidate: this checkout's")
    print(f"{'request':<23} {'baseline us':>12} {'candidate us':>13} {'ratio':>6}   ratio of each round")
    for kind in [row for k in KINDS for row in (k, f"{k}, round trip")]:
        old, new = (sum(r[side][kind] for r in rounds) / len(rounds) for side in SIDES)
        each = " ".join(f"{r['candidate'][kind] / r['baseline'][kind]:.3f}" for r in rounds)
        print(f"{kind:<23} {old:>12.1f} {new:>13.1f} {new / old if old else 0.0:>6.3f}   {each}")


if __name__ == "__main__":
    main()
