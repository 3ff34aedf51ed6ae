"""A GetRows round trip over real gRPC on loopback, small and large responses.

A mapper's :class:`~millstream.rpc.server.RowsServer` in this process serves a fixed
Arrow IPC payload (what a window's ``get_rows`` returns) to a
:class:`~millstream.rpc.client.GrpcRowsClient`; ``0 rows`` is the acknowledgement a
reducer sends after each commit. The window's own ``get_rows`` (no RPC) is measured
beside it, for the cost of the RPC layer alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from millstream import _core
from millstream.rpc.calls import GetRowsCall
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer

from bench.micro.conftest import input_batch

MAX_MESSAGE = 64 << 20
ROWS = [0, 1_000, 65_536, 250_000]


class FixedPayload:
    """Serves the same payload (or nothing, for 0 rows) to every call."""

    def __init__(self, rows: int, payload: bytes) -> None:
        self.rows = rows
        self.payload = payload

    def handle_get_rows(
        self, reducer: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        if max_rows == 0 or self.rows == 0:
            return 0, committed, b""
        return self.rows, committed + self.rows, self.payload


def _window(rows: int) -> _core.Window:
    window = _core.Window(1, 1 << 31)
    if rows:
        batch = input_batch(rows)
        window.push(batch, pa.array([0] * rows, pa.int32()), rows, b"")
    return window


@pytest.fixture(params=ROWS, ids=lambda n: f"{n}rows")
def rows(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def served(rows: int) -> Iterator[tuple[GrpcRowsClient, GetRowsCall, int]]:
    payload = _window(rows).get_rows(0, -1, 1 << 30, 1 << 30)[2] if rows else b""
    server = RowsServer(FixedPayload(rows, payload), "127.0.0.1:0", MAX_MESSAGE, 32 << 20)
    client = GrpcRowsClient(10.0, MAX_MESSAGE)
    call = GetRowsCall(0, f"127.0.0.1:{server.port}", "guid", 0, -1, max(rows, 0), 32 << 20)
    client.get_rows_many([call])  # connect
    yield client, call, len(payload)
    client.close()
    server.stop()


def test_get_rows_grpc(benchmark: Any, served: tuple[GrpcRowsClient, GetRowsCall, int]) -> None:
    """One ``get_rows_many`` with one call, answered over gRPC on loopback."""
    client, call, size = served
    benchmark.extra_info["payload_bytes"] = size
    result = benchmark(client.get_rows_many, [call])[0]
    assert not isinstance(result, BaseException), result


def test_get_rows_window_only(benchmark: Any, rows: int) -> None:
    """The window's ``get_rows`` (bucket walk and IPC serialization), no RPC."""
    window = _window(rows)
    benchmark.extra_info["rows"] = rows
    count, _, _ = benchmark(window.get_rows, 0, -1, 1 << 30, 1 << 30)
    assert count == rows
