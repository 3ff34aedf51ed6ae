"""GetRows over real gRPC on loopback: fields, caps, stale GUIDs, unreachable mappers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from millstream import _core
from millstream.exceptions import StaleMapperError
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.rpc.calls import GetRowsCall, GetRowsResult, NotAnsweredYet
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer

ROOT = Path(__file__).resolve().parents[3]
GUID = "mapper-guid"
MAX_RESPONSE = 4_096


class WindowHandler:
    """Serves GetRows from a real window, like the mapper worker does (instance ``guid``,
    rows ``first``, ``first + 1``, ...)."""

    def __init__(self, guid: str = GUID, first: int = 0) -> None:
        self.guid = guid
        self.window = _core.Window(2, 1 << 24)
        batch = pa.record_batch({"x": pa.array(range(first, first + 1_000), pa.int64())})
        self.window.push(batch, pa.array([i % 2 for i in range(1_000)], pa.int32()), 1_000, b"t")
        self.calls: list[tuple[int, int, int, int]] = []
        self.options: list[dict[str, Any]] = []

    def handle_get_rows(
        self,
        reducer_index: int,
        committed: int,
        max_rows: int,
        max_bytes: int,
        mapper_guid: str,
        **options: Any,
    ) -> tuple[int, int, bytes]:
        if mapper_guid != self.guid:
            raise StaleMapperError(f"stale {mapper_guid}")
        self.calls.append((reducer_index, committed, max_rows, max_bytes))
        self.options.append(options)
        return self.window.get_rows(
            reducer_index,
            committed,
            max_rows,
            max_bytes,
            options.get("after_row_index"),
            options.get("shuffle_indices", False),
        )


@pytest.fixture
def served() -> Iterator[tuple[WindowHandler, str]]:
    handler = WindowHandler()
    server = RowsServer(handler, "127.0.0.1:0", 1 << 20, MAX_RESPONSE)
    yield handler, f"127.0.0.1:{server.port}"
    server.stop(0)


def _call(address: str, **changes: object) -> GetRowsCall:
    fields: dict[str, object] = {
        "mapper_index": 0,
        "address": address,
        "mapper_guid": GUID,
        "reducer_index": 1,
        "committed_row_index": -1,
        "max_rows": 10,
        "max_bytes": 1 << 20,
    }
    fields.update(changes)
    return GetRowsCall(**fields)  # type: ignore[arg-type]


def test_rows_travel_as_arrow_ipc(served: tuple[WindowHandler, str]) -> None:
    handler, address = served
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        (result,) = client.get_rows_many([_call(address, committed_row_index=5)])
    finally:
        client.close()
    assert isinstance(result, GetRowsResult)
    assert result.row_count == 10
    assert result.last_shuffle_row_index == 25
    assert _core.decode_ipc([result.arrow_ipc])["x"].to_pylist() == list(range(7, 27, 2))
    # The server caps the requested bytes at its own response limit.
    assert handler.calls == [(1, 5, 10, MAX_RESPONSE)]


def test_a_prefetched_call_serves_the_round_that_continues_from_it(
    served: tuple[WindowHandler, str],
) -> None:
    """A pipelined reducer asks for the rows after the ones it is committing; once that
    commit landed, the next round's call (from the new committed index) takes the answer
    without asking again. The fetch position and the shuffle indices cross gRPC."""
    handler, address = served
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        client.prefetch([_call(address, after_row_index=5, shuffle_indices=True)])
        (result,) = client.get_rows_many(
            [_call(address, committed_row_index=5, shuffle_indices=True)]
        )
        assert handler.options == [{"after_row_index": 5, "shuffle_indices": True}]
        assert handler.calls == [(1, -1, 10, MAX_RESPONSE)], "one request: the prefetched one"
        assert isinstance(result, GetRowsResult)
        rows = _core.decode_ipc([result.arrow_ipc])
        assert rows["x"].to_pylist() == list(range(7, 27, 2))
        assert rows[_core.SHUFFLE_INDEX_COLUMN].to_pylist() == list(range(7, 27, 2))
        # An answer that does not continue from the call's start serves nobody.
        client.prefetch([_call(address, after_row_index=25)])
        (again,) = client.get_rows_many([_call(address, committed_row_index=5)])
        assert isinstance(again, GetRowsResult)
        assert again.last_shuffle_row_index == 25
        assert handler.calls[-1] == (1, 5, 10, MAX_RESPONSE)
    finally:
        client.close()


def test_response_is_capped_by_bytes(served: tuple[WindowHandler, str]) -> None:
    _, address = served
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        (result,) = client.get_rows_many([_call(address, max_rows=1_000, max_bytes=800)])
    finally:
        client.close()
    assert isinstance(result, GetRowsResult)
    assert 0 < result.row_count < 500
    assert result.last_shuffle_row_index == 2 * result.row_count - 1


class SkewedHandler:
    """A window whose reducer 0 gets one 100 KB row in 20 and reducer 1 small rows."""

    ROWS, EVERY = 4_000, 20

    def __init__(self) -> None:
        self.window = _core.Window(2, 1 << 30)
        n, every = self.ROWS, self.EVERY
        strings = ["x" * 100_000 if i % every == 0 else str(i) for i in range(n)]
        batch = pa.record_batch({"v": pa.array(range(n), pa.int64()), "s": pa.array(strings)})
        reducers = pa.array([0 if i % every == 0 else 1 for i in range(n)], pa.int32())
        self.window.push(batch, reducers, n, b"t")

    def handle_get_rows(
        self, reducer_index: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        return self.window.get_rows(reducer_index, committed, max_rows, max_bytes)


def test_byte_cap_holds_for_skewed_row_sizes() -> None:
    """The cap counts the rows returned, not an average over every reducer's rows: each
    response stays within it (and the gRPC limit), and the reducer drains its large rows."""
    limit, cap = 4 << 20, 1 << 20
    server = RowsServer(SkewedHandler(), "127.0.0.1:0", limit, 2 << 20)
    client = GrpcRowsClient(5.0, limit)
    address = f"127.0.0.1:{server.port}"
    committed, values, sizes = -1, [], []
    try:
        for _ in range(100):
            call = _call(address, reducer_index=0, committed_row_index=committed, max_rows=10**6)
            (result,) = client.get_rows_many([dataclasses.replace(call, max_bytes=cap)])
            assert isinstance(result, GetRowsResult), result
            if result.row_count == 0:
                break
            sizes.append(len(result.arrow_ipc))
            values += _core.decode_ipc([result.arrow_ipc])["v"].to_pylist()
            committed = result.last_shuffle_row_index
    finally:
        client.close()
        server.stop(0)
    assert values == list(range(0, SkewedHandler.ROWS, SkewedHandler.EVERY))
    assert max(sizes) <= cap, sizes
    assert len(sizes) == 20, sizes  # nine or ten 100 KB rows per response, not one


def test_stale_guid_is_failed_precondition(served: tuple[WindowHandler, str]) -> None:
    handler, address = served
    channel = grpc.insecure_channel(address)
    stub = millstream_pb2_grpc.MapperStub(channel)  # type: ignore[no-untyped-call]
    request = millstream_pb2.GetRowsRequest(
        count=1, reducer_index=0, committed_row_index=-1, mapper_guid="old"
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetRows(request, timeout=5)
    channel.close()
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        (result,) = client.get_rows_many([_call(address, mapper_guid="old")])
    finally:
        client.close()
    assert isinstance(result, StaleMapperError)
    assert handler.calls == []


def test_one_server_serves_several_partitions_by_instance_guid() -> None:
    # A mapper worker reading several partitions serves them all on one port; each call
    # names the instance (partition) it is for, and an unknown one is stale.
    handlers = {"p0": WindowHandler("p0", 0), "p2": WindowHandler("p2", 10_000)}
    server = RowsServer(handlers, "127.0.0.1:0", 1 << 20, MAX_RESPONSE)
    address = f"127.0.0.1:{server.port}"
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        first, second, stale = client.get_rows_many(
            [
                _call(address, mapper_index=0, mapper_guid="p0", max_rows=2),
                _call(address, mapper_index=2, mapper_guid="p2", max_rows=2),
                _call(address, mapper_index=4, mapper_guid="p4", max_rows=2),
            ]
        )
    finally:
        client.close()
        server.stop(0)
    assert isinstance(first, GetRowsResult)
    assert isinstance(second, GetRowsResult)
    assert _core.decode_ipc([first.arrow_ipc])["x"].to_pylist() == [1, 3]
    assert _core.decode_ipc([second.arrow_ipc])["x"].to_pylist() == [10_001, 10_003]
    assert isinstance(stale, StaleMapperError)
    assert "p4" in str(stale)


def test_unreachable_mapper_is_an_error_in_its_slot(served: tuple[WindowHandler, str]) -> None:
    _, address = served
    client = GrpcRowsClient(1.0, 1 << 20)
    try:
        down, up = client.get_rows_many([_call("127.0.0.1:1"), _call(address)])
    finally:
        client.close()
    assert isinstance(down, grpc.RpcError)
    assert isinstance(up, GetRowsResult)
    assert up.row_count == 10


def test_generated_code_is_current() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


class FreezableHandler(WindowHandler):
    """A window handler that blocks while frozen, as a SIGSTOPped mapper does."""

    def __init__(self) -> None:
        super().__init__()
        self.thawed = threading.Event()
        self.requests = 0

    def handle_get_rows(
        self, reducer_index: int, committed: int, max_rows: int, max_bytes: int, mapper_guid: str
    ) -> tuple[int, int, bytes]:
        self.requests += 1
        self.thawed.wait(30)
        return super().handle_get_rows(reducer_index, committed, max_rows, max_bytes, mapper_guid)


def test_a_frozen_mapper_holds_no_round_and_its_late_answer_is_used_once(
    served: tuple[WindowHandler, str],
) -> None:
    _, healthy = served
    frozen = FreezableHandler()
    server = RowsServer(frozen, "127.0.0.1:0", 1 << 20, MAX_RESPONSE)
    slow = f"127.0.0.1:{server.port}"
    client = GrpcRowsClient(20.0, 1 << 20, wait_seconds=0.1)
    try:
        calls = [_call(healthy, mapper_index=0), _call(slow, mapper_index=1)]
        # The round answers with the healthy mapper's rows and leaves the frozen one's call
        # under way (before: it waited for every answer, up to the call's deadline).
        first = client.get_rows_many(calls)
        assert isinstance(first[0], GetRowsResult)
        assert first[0].row_count == 10
        assert isinstance(first[1], NotAnsweredYet)
        second = client.get_rows_many(calls)
        assert isinstance(second[1], NotAnsweredYet)
        assert frozen.requests == 1  # not sent again while under way
        frozen.thawed.set()
        late = client.get_rows_many([_call(slow, mapper_index=1)])[0]
        deadline = time.monotonic() + 10
        while isinstance(late, NotAnsweredYet) and time.monotonic() < deadline:
            late = client.get_rows_many([_call(slow, mapper_index=1)])[0]
        # The late answer is used, once: the next round sends a new call.
        assert isinstance(late, GetRowsResult)
        assert late.row_count == 10
        assert frozen.requests == 1
        again = client.get_rows_many([_call(slow, mapper_index=1, committed_row_index=19)])[0]
        assert isinstance(again, GetRowsResult)
        assert again.last_shuffle_row_index == 39
        assert frozen.requests == 2
    finally:
        frozen.thawed.set()
        client.close()
        server.stop(0)


def test_a_call_under_way_from_another_committed_index_is_not_used() -> None:
    frozen = FreezableHandler()
    server = RowsServer(frozen, "127.0.0.1:0", 1 << 20, MAX_RESPONSE)
    slow = f"127.0.0.1:{server.port}"
    client = GrpcRowsClient(20.0, 1 << 20, wait_seconds=0.05)
    try:
        (pending,) = client.get_rows_many([_call(slow, committed_row_index=-1)])
        assert isinstance(pending, NotAnsweredYet)
        frozen.thawed.set()
        # The reducer's committed index moved (another instance committed, say): the answer
        # to the old call would not continue from it, so a new call is made.
        result: GetRowsResult | BaseException = NotAnsweredYet("")
        deadline = time.monotonic() + 10
        while isinstance(result, NotAnsweredYet) and time.monotonic() < deadline:
            (result,) = client.get_rows_many([_call(slow, committed_row_index=5)])
        assert isinstance(result, GetRowsResult)
        assert (result.row_count, result.last_shuffle_row_index) == (10, 25)
        assert frozen.requests == 2
    finally:
        frozen.thawed.set()
        client.close()
        server.stop(0)


def _thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads started from now on, but the servers' (gRPC's client's
    included)."""
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        if not thread.name.startswith("getrows"):
            started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    return started


def test_calls_one_after_another_start_no_thread_each(
    served: tuple[WindowHandler, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC's synchronous client starts a thread for a call on a channel with none under
    way; the Hold call a reducer keeps on each channel spares its rounds, one call after
    another, a thread start each."""
    _, address = served
    client = GrpcRowsClient(5.0, 1 << 20)
    started = _thread_starts(monkeypatch)
    try:
        for _ in range(20):
            (result,) = client.get_rows_many([_call(address, committed_row_index=5)])
            assert isinstance(result, GetRowsResult)
    finally:
        client.close()
    assert len(started) <= 1, started


def test_a_server_without_threads_to_hold_calls_still_serves_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mapper that keeps no thread for Hold calls refuses them; GetRows works as before
    (a thread per call) and the client does not ask for a hold with every call."""
    handler = WindowHandler()
    server = RowsServer(handler, "127.0.0.1:0", 1 << 20, MAX_RESPONSE, max_held_calls=0)
    address = f"127.0.0.1:{server.port}"
    client = GrpcRowsClient(5.0, 1 << 20)
    holds: list[object] = []
    stub_init = millstream_pb2_grpc.MapperStub.__init__

    def counting_stub(stub: millstream_pb2_grpc.MapperStub, channel: grpc.Channel) -> None:
        stub_init(stub, channel)
        hold = stub.Hold

        class Counted:
            def future(self, *args: Any, **kwargs: Any) -> grpc.Future:
                holds.append(args)
                return hold.future(*args, **kwargs)

        stub.Hold = Counted()  # type: ignore[assignment]

    monkeypatch.setattr(millstream_pb2_grpc.MapperStub, "__init__", counting_stub)
    started = _thread_starts(monkeypatch)
    try:
        for _ in range(20):
            (result,) = client.get_rows_many([_call(address, committed_row_index=5)])
            assert isinstance(result, GetRowsResult)
            assert result.row_count == 10
    finally:
        client.close()
        server.stop(0)
    assert len(holds) == 1
    # A thread per call, as without holds (but a call that begins before the last call's
    # thread has ended its loop finds that thread still there).
    assert len(started) >= 10, started


def test_a_stopping_server_answers_its_hold_calls() -> None:
    """Hold calls do not keep a stopping mapper for its grace period: they are answered
    (not cancelled when the grace runs out)."""
    server = RowsServer(WindowHandler(), "127.0.0.1:0", 1 << 20, MAX_RESPONSE)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        hold = millstream_pb2_grpc.MapperStub(channel).Hold.future(
            millstream_pb2.HoldRequest(hold_ms=60_000), timeout=30
        )
        with pytest.raises(grpc.FutureTimeoutError):
            hold.result(timeout=0.2)  # held
        server.stop(grace=20)
        assert isinstance(hold.result(timeout=10), millstream_pb2.HoldResponse)
    finally:
        channel.close()
