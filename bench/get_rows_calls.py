"""CPU of one GetRows call on each side, with and without the channel's Hold call.

A reducer's rounds make their GetRows calls one after another, with the channel idle in
between; gRPC's synchronous client starts a thread for a call on a channel without one
under way, unless a call the mapper holds (``Hold``) keeps one there. This benchmark serves
a window of rows on loopback (:class:`~millstream.rpc.server.RowsServer`, in this process)
and makes ``--calls`` calls from a client in a child process (its CPU is its own), with a
pause of ``--pause`` seconds after each, once with a server that holds no call
(``max_held_calls=0``: every call starts a thread, as before Hold) and once with the
default, in turn, ``--pairs`` times. Reported per call: wall time (without the pause) and
CPU of the client and of the server (user + system, ``getrusage``).

Run::

    .venv/bin/python -m bench.get_rows_calls --pairs 3
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import pyarrow as pa
from millstream import _core
from millstream.rpc.calls import GetRowsCall
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer

GUID = "bench-mapper"
ROWS = 1_000


class _WindowHandler:
    """Serves GetRows from a real window of ``ROWS`` rows for two reducers."""

    def __init__(self) -> None:
        self.window = _core.Window(2, 1 << 24)
        batch = pa.record_batch({"x": pa.array(range(ROWS), pa.int64())})
        parts = pa.array([i % 2 for i in range(ROWS)], pa.int32())
        self.window.push(batch, parts, ROWS, b"bench")

    def handle_get_rows(
        self, reducer_index: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        return self.window.get_rows(reducer_index, committed, max_rows, max_bytes, None, False)


def _client(address: str, calls: int, pause: float) -> None:
    """The child process: ``calls`` calls for 10 rows each; prints wall and CPU seconds."""
    client = GrpcRowsClient(10.0, 1 << 24)
    call = GetRowsCall(
        mapper_index=0,
        address=address,
        mapper_guid=GUID,
        reducer_index=1,
        committed_row_index=99,
        max_rows=10,
        max_bytes=1 << 20,
    )
    for _ in range(50):  # connect, warm up
        client.get_rows_many([call])
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = 0.0
    for _ in range(calls):
        start = time.perf_counter()
        client.get_rows_many([call])
        wall += time.perf_counter() - start
        time.sleep(pause)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    client.close()
    print(wall, cpu)


def measure(held: int, calls: int, pause: float) -> dict[str, float]:
    """Per-call wall, client CPU and server CPU (microseconds) against a server holding at
    most ``held`` Hold calls."""
    server = RowsServer(_WindowHandler(), "127.0.0.1:0", 1 << 24, 1 << 20, max_held_calls=held)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.get_rows_calls",
                "--client",
                f"127.0.0.1:{server.port}",
                "--calls",
                str(calls),
                "--pause",
                str(pause),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        server.stop(0)
    wall, cpu = map(float, out.split())
    served = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "wall_us": wall / calls * 1e6,
        "client_cpu_us": cpu / calls * 1e6,
        # The warm-up calls count here too.
        "server_cpu_us": served / (calls + 50) * 1e6,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--pause", type=float, default=0.001, help="seconds after each call")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        _client(args.client, args.calls, args.pause)
        return
    print("| server | wall us/call | client CPU us/call | server CPU us/call |")
    print("|---|---|---|---|")
    for _ in range(args.pairs):
        for held, name in ((0, "holds none"), (8, "holds (default)")):
            r = measure(held, args.calls, args.pause)
            print(
                f"| {name} | {r['wall_us']:.0f} | {r['client_cpu_us']:.0f} | "
                f"{r['server_cpu_us']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
