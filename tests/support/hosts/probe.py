"""Both ends of GetRows across two hosts, for the half-open connection test.

``probe.py serve HOST``: a mapper's GetRows server (a window of 100 rows) on ``HOST``;
prints its port. ``probe.py watch ADDRESS``: a reducer's client of it; prints
``connected`` after a first answered call, then answers commands read from stdin:
``states`` prints the channel states seen since the last ``states`` (``-`` for none) and
``call`` prints ``ok`` or the error of one GetRows call.
"""

from __future__ import annotations

import sys
import threading

import grpc
import pyarrow as pa
from millstream import _core
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer

GUID = "probe"


class _Handler:
    def __init__(self) -> None:
        self.window = _core.Window(1, 1 << 24)
        batch = pa.record_batch({"x": pa.array(range(100), pa.int64())})
        self.window.push(batch, pa.array([0] * 100, pa.int32()), 100, b"t")

    def handle_get_rows(
        self, reducer_index: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        return self.window.get_rows(reducer_index, -1, max_rows, max_bytes)


def serve(host: str) -> None:
    server = RowsServer(_Handler(), f"{host}:0", 1 << 20, 1 << 16)
    print(server.port, flush=True)
    sys.stdin.read()  # until the test closes stdin
    server.stop(0)


def watch(address: str) -> None:
    client = GrpcRowsClient(1.0, 1 << 20)
    call = GetRowsCall(0, address, GUID, 0, -1, 10, 1 << 20)
    (first,) = client.get_rows_many([call])
    if not isinstance(first, GetRowsResult):
        print(f"error {first!r}", flush=True)
        return
    channel = client._channels[address][0]  # the client's own channel to the mapper
    seen: list[str] = []
    lock = threading.Lock()

    def changed(state: grpc.ChannelConnectivity) -> None:
        with lock:
            seen.append(state.name)

    channel.subscribe(changed, try_to_connect=False)
    print("connected", flush=True)
    for line in sys.stdin:
        if line.strip() == "states":
            with lock:
                states, seen[:] = list(seen), []
            print(" ".join(states) or "-", flush=True)
        elif line.strip() == "call":
            (result,) = client.get_rows_many([call])
            print("ok" if isinstance(result, GetRowsResult) else f"error {result!r}", flush=True)
    client.close()


if __name__ == "__main__":
    {"serve": serve, "watch": watch}[sys.argv[1]](sys.argv[2])
