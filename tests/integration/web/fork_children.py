"""A process that opens a client and forks two children (argv: a server's address, then `open` or `closed`).

open: the client is open at the fork, and the parent closes it meanwhile; each child finds the parent's client
refusing (ForkedClientError).
Either way (closed: the parent closed its client before forking) a new client of the child's own is refused at
once too: gRPC cannot connect in a child forked after it was used (without the refusal the child aborts or hangs).

Prints the children's exit statuses; exits 0 when both did what their mode expects."""

from __future__ import annotations

import os
import sys
import traceback

from tests.component.client.helpers import Ctx, MemoryCallbacks
from waltz_client import ForkedClientError, WaltzClient


def child(parent_client: WaltzClient, config: dict[str, object], mode: str) -> int:
    if mode == "open":
        try:
            parent_client.submit_and_wait(Ctx(b"from the parent's client"), timeout=5)
            return 2  # it must not serve here
        except ForkedClientError:
            pass
    try:
        WaltzClient(MemoryCallbacks(), config).close()
        return 3
    except ForkedClientError as exc:
        return 0 if f"forked from process {os.getppid()} after a client had connected" in str(exc) else 4


def main() -> int:
    address, mode = sys.argv[1:3]
    config: dict[str, object] = {"client.servers": address, "client.mountTimeout": 30}
    parent_client = WaltzClient(MemoryCallbacks(), config)
    assert parent_client.submit_and_wait(Ctx(b"parent"), timeout=30)
    if mode == "closed":
        parent_client.close()
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child(parent_client, config, mode)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        children.append(pid)
    parent_client.close()
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    print("children:", codes, flush=True)
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
