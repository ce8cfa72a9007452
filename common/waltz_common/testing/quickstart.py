"""The quick start: bring up a local cluster on loopback, show its state, and stop it cleanly."""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile

from waltz_common.testing.zookeeper import ZooKeeperProcess


def four_letter_word(connect_string: str, word: str) -> str:
    host, port = connect_string.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(word.encode())
        chunks = []
        while chunk := conn.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quickstart", description=__doc__)
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="waltz-quickstart-") as workdir:
        print(f"starting ZooKeeper in {workdir} ...", flush=True)
        with ZooKeeperProcess(workdir) as zookeeper:
            print(f"ZooKeeper is up at {zookeeper.connect_string} (pid {zookeeper.pid})")
            print(four_letter_word(zookeeper.connect_string, "srvr").rstrip())
            print("stopping ZooKeeper ...", flush=True)
        print("done: everything stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
