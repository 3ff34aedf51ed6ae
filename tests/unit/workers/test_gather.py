"""A reducer whose mappers are behind lets each mapper gather a commit's worth of rows."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.testing import InProcessTransport
from millstream.workers import MapperWorker, ReducerWorker

from tests.support.worker_fixtures import CountRows, MemoryInput, PassThrough

BATCH = 100
ROWS = 1_000


def _processor(tmp_path: Path, **tuning: object) -> ms.Processor:
    rows = pa.table({"key": pa.array(range(ROWS), pa.int64())})
    return ms.Processor(
        mapper=PassThrough,
        reducer=CountRows,
        input=MemoryInput([rows], bounded=False),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        tuning=ms.Tuning(batch_rows=BATCH, **tuning),  # type: ignore[arg-type]
    )


@contextmanager
def _served(tmp_path: Path, **tuning: object) -> Iterator[tuple[MapperWorker, GrpcRowsClient, str]]:
    """A started mapper behind a GetRows server, and a client whose calls fail after 5 s."""
    processor = _processor(tmp_path, **tuning)
    store = processor.open_store()
    worker = MapperWorker(processor, 0, store, guid="m0")
    worker.start_ingestion()
    server = RowsServer(worker, "127.0.0.1:0", 1 << 24, 1 << 20)
    client = GrpcRowsClient(5.0, 1 << 24)
    try:
        yield worker, client, f"127.0.0.1:{server.port}"
    finally:
        client.close()
        server.stop(0)
        worker.close()
        store.close()


def _call(address: str, gather_rows: int, wait_seconds: float = 20.0) -> GetRowsCall:
    return GetRowsCall(0, address, "m0", 0, -1, 10_000, 1 << 20, wait_seconds, gather_rows)


def _held_until(
    client: GrpcRowsClient, call: GetRowsCall, worker: MapperWorker, *, batches: int
) -> GetRowsResult | BaseException:
    """Make ``call`` in the background while the mapper reads ``batches`` batches: the
    call is still held after the first and answered after the last."""
    results: list[GetRowsResult | BaseException] = []
    asking = threading.Thread(target=lambda: results.extend(client.get_rows_many([call])))
    asking.start()
    try:
        assert worker.ingest_once()
        time.sleep(0.2)
        assert asking.is_alive()  # one batch is not enough: still held
        for _ in range(batches - 1):
            assert worker.ingest_once()
        asking.join(5)
        assert not asking.is_alive()
    finally:
        asking.join(10)
    (result,) = results
    return result


def test_a_mapper_is_behind_while_its_reads_fill_whole_batches(tmp_path: Path) -> None:
    with _served(tmp_path) as (worker, _, _):
        assert worker.behind  # until the first read says otherwise
        assert worker.ingest_once()
        assert worker.behind
        while worker.ingest_once():
            pass
        assert not worker.behind  # caught up: the last read found nothing new


def test_a_gathering_call_is_held_until_its_rows_wait(tmp_path: Path) -> None:
    with _served(tmp_path) as (worker, client, address):
        result = _held_until(client, _call(address, 3 * BATCH), worker, batches=3)
        assert isinstance(result, GetRowsResult)
        assert result.row_count == 3 * BATCH
        assert result.behind


def test_a_pipelined_call_gathers_rows_after_its_fetch_position(tmp_path: Path) -> None:
    """A reducer fetching while it commits asks for the rows after the ones it commits:
    those do not count toward what it gathers."""
    with _served(tmp_path) as (worker, client, address):
        assert worker.ingest_once()
        assert worker.ingest_once()
        call = dataclasses.replace(_call(address, 2 * BATCH), after_row_index=2 * BATCH - 1)
        result = _held_until(client, call, worker, batches=2)
        assert isinstance(result, GetRowsResult)
        assert result.row_count == 2 * BATCH
        assert result.last_shuffle_row_index == 4 * BATCH - 1


def test_a_mapper_that_caught_up_answers_at_once(tmp_path: Path) -> None:
    with _served(tmp_path) as (worker, client, address):
        while worker.ingest_once():
            pass
        # Held for the 20 s it names, the call would fail on its 5 s deadline.
        (result,) = client.get_rows_many([_call(address, 100 * ROWS)])
        assert isinstance(result, GetRowsResult)
        assert result.row_count == ROWS
        assert not result.behind


def test_a_half_full_window_answers_at_once(tmp_path: Path) -> None:
    with _served(tmp_path, memory_limit_bytes=4 * BATCH * 8) as (worker, client, address):
        window = worker.window
        assert window is not None
        while 2 * window.snapshot().buffered_bytes < window.snapshot().memory_limit_bytes:
            assert worker.ingest_once()
        assert worker.behind
        (result,) = client.get_rows_many([_call(address, 100 * ROWS)])
        assert isinstance(result, GetRowsResult)
        assert 0 < result.row_count < ROWS
        assert result.behind


def test_a_gathering_call_answers_what_it_has_when_its_hold_ends(tmp_path: Path) -> None:
    with _served(tmp_path) as (worker, client, address):
        assert worker.ingest_once()
        (result,) = client.get_rows_many([_call(address, 100 * ROWS, wait_seconds=0.3)])
        assert isinstance(result, GetRowsResult)
        assert result.row_count == BATCH


@pytest.mark.parametrize("gather_seconds", [2.0, 0.0])
def test_a_reducer_gathers_a_commits_worth_while_its_mappers_are_behind(
    tmp_path: Path, gather_seconds: float
) -> None:
    processor = _processor(tmp_path, gather_seconds=gather_seconds)
    store = processor.open_store()
    try:
        reducer = ReducerWorker(processor, 0, store, InProcessTransport(), guid="r0")
        on = gather_seconds > 0
        assert reducer.gathering is on  # mappers are assumed behind at start
        assert reducer._gather_rows(1_000, 8_000) == (1_000 if on else 0)  # row size unknown
        reducer.fetch_sizing.row_bytes = 16.0
        assert reducer._gather_rows(1_000, 8_000) == (500 if on else 0)  # the byte cap binds
        reducer.behind = False
        assert not reducer.gathering
        assert reducer._gather_rows(1_000, 8_000) == 0
    finally:
        store.close()
