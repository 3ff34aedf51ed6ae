"""A process with live GetRows channels can start child processes.

gRPC's fork handlers restart its pollers in a forked child, which can crash before it
execs (grpc/grpc#43055); PySpark starts its JVM that way (``subprocess.Popen`` with a
``preexec_fn``), and the test suite's Spark tests failed so once. ``import millstream``
turns the handlers off unless the environment sets them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILDREN = 500

SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading

    from millstream.rpc.calls import GetRowsCall
    from millstream.rpc.client import GrpcRowsClient
    from millstream.rpc.server import RowsServer


    class Empty:
        def handle_get_rows(self, reducer, committed, max_rows, max_bytes, mapper_guid):
            return 0, committed, b""


    server = RowsServer(Empty(), "127.0.0.1:0", 1 << 20, 1 << 20)
    client = GrpcRowsClient(10.0, 1 << 20)
    call = GetRowsCall(0, f"127.0.0.1:{server.port}", "guid", 0, -1, 10, 1 << 20)
    done = threading.Event()


    def calls():
        while not done.is_set():
            client.get_rows_many([call])


    threading.Thread(target=calls, daemon=True).start()
    failed = 0
    for _ in range(int(sys.argv[1])):
        child = subprocess.Popen(["true"], preexec_fn=lambda: None, stderr=subprocess.DEVNULL)
        failed += child.wait() != 0
    done.set()
    support = os.environ.get("GRPC_ENABLE_FORK_SUPPORT")
    print(json.dumps({"failed": failed, "fork_support": support}))
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_children_started_beside_live_get_rows_calls_all_start() -> None:
    """500 children forked (with a ``preexec_fn``) while GetRows calls run on another
    thread all exec and exit 0 (with gRPC's fork handlers on, 3-9 of 500 crashed here)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(CHILDREN)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"failed": 0, "fork_support": "false"}
