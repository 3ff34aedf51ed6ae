"""A GetRows that finds no rows waits on the mapper and answers when rows arrive."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
from millstream.rpc.calls import AnswerWaiter, GetRowsCall, GetRowsResult, NotAnsweredYet
from millstream.rpc.client import GrpcRowsClient
from millstream.rpc.server import RowsServer
from millstream.testing import MemoryInput
from millstream.workers import MapperWorker


class Route(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class Count(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.add(("rows",), batch.num_rows)


class CountingMapper(MapperWorker):
    """Counts the GetRows calls that reach the mapper's handler."""

    handled = 0

    def handle_get_rows(self, *args: object) -> tuple[int, int, bytes]:
        type(self).handled += 1
        return super().handle_get_rows(*args)  # type: ignore[arg-type]


@contextmanager
def serving(
    tmp_path: Path,
    keys: Sequence[int],
    *,
    worker_class: type[MapperWorker] = MapperWorker,
    timeout_seconds: float = 5.0,
    client_options: dict[str, float] | None = None,
    **processor: Any,
) -> Iterator[tuple[MapperWorker, str, GrpcRowsClient]]:
    """A mapper of ``keys`` for one reducer behind a GetRows server; yields the worker, its
    address and a client whose calls fail after ``timeout_seconds``."""
    table = pa.table({"key": pa.array(keys, pa.int64())})
    spec = ms.Processor(
        mapper=Route,
        reducer=Count,
        input=MemoryInput([table]),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        **processor,
    )
    store = spec.open_store()
    worker = worker_class(spec, 0, store, guid="m0")
    worker.start_ingestion()
    server = RowsServer(worker, "127.0.0.1:0", 1 << 24, 1 << 20)
    client = GrpcRowsClient(timeout_seconds, 1 << 24, **(client_options or {}))
    try:
        yield worker, f"127.0.0.1:{server.port}", client
    finally:
        client.close()
        server.stop(0)
        worker.close()
        store.close()


def _answer_once_rows_arrive(
    worker: MapperWorker, address: str, client: GrpcRowsClient
) -> GetRowsResult:
    """Ask for rows from another thread; once the call found the window empty and the
    asking thread still waits (held, not answered with nothing), let rows arrive and return
    the answer."""
    CountingMapper.handled = 0
    call = GetRowsCall(0, address, "m0", 0, -1, 10_000, 1 << 20, 20.0)
    results: list[GetRowsResult | BaseException] = []
    asking = threading.Thread(target=lambda: results.extend(client.get_rows_many([call])))
    try:
        asking.start()
        deadline = time.monotonic() + 10
        while CountingMapper.handled == 0:  # the call found the window empty
            assert time.monotonic() < deadline, "the call never reached the mapper"
            time.sleep(0.01)
        assert asking.is_alive()
        assert worker.ingest_once()  # rows arrive
        asking.join(15)
        assert not asking.is_alive()
        (result,) = results
        assert isinstance(result, GetRowsResult)
        return result
    finally:
        asking.join(20)


def test_get_rows_waits_for_rows_and_answers_when_they_arrive(tmp_path: Path) -> None:
    # The client waits for every answer.
    with serving(tmp_path, range(1_000), worker_class=CountingMapper, timeout_seconds=30.0) as (
        worker,
        address,
        client,
    ):
        assert _answer_once_rows_arrive(worker, address, client).row_count == 1_000
        assert CountingMapper.handled == 2  # looked again once, when the rows came


def test_a_round_that_waits_for_no_mapper_still_waits_for_the_first_answer(
    tmp_path: Path,
) -> None:
    """``wait_seconds=0``: a round goes on with the answers it has, but one with none yet
    (every mapper holds its call until rows arrive) takes the first answer when it comes
    instead of coming back empty, so the rows are reduced as soon as they arrive."""
    with serving(
        tmp_path,
        range(1_000),
        worker_class=CountingMapper,
        timeout_seconds=30.0,
        client_options={"wait_seconds": 0.0, "first_answer_seconds": 20.0},
    ) as (worker, address, client):
        assert _answer_once_rows_arrive(worker, address, client).row_count == 1_000


def test_an_acknowledgement_never_waits(tmp_path: Path) -> None:
    with serving(tmp_path, []) as (_, address, client):
        # max_rows 0 only reports the committed index: answered at once despite the 20 s
        # wait it names (held, it would fail on the call's 5 s deadline).
        ack = GetRowsCall(0, address, "m0", 0, -1, 0, 1 << 20, 20.0)
        (result,) = client.get_rows_many([ack])
        assert isinstance(result, GetRowsResult)
        assert result.row_count == 0


def test_a_mapper_whose_input_ended_answers_at_once(tmp_path: Path) -> None:
    """Nothing more will come for a reducer that fetched everything of a mapper whose
    bounded input ended: its GetRows is answered at once (input_ended), not held, so that
    the reducer's last round of a bounded job does not wait for the mapper to drain."""
    with serving(tmp_path, range(10)) as (worker, address, client):
        assert worker.ingest_once()
        assert not worker.ingest_once()  # the end of the input
        assert worker.end_of_input
        (rows,) = client.get_rows_many([GetRowsCall(0, address, "m0", 0, -1, 100, 1 << 20, 20.0)])
        assert isinstance(rows, GetRowsResult)
        assert rows.row_count == 10
        # The next call, past every row, names a 20 s wait: held, it would fail on the
        # call's 5 s deadline.
        after = GetRowsCall(0, address, "m0", 0, rows.last_shuffle_row_index, 100, 1 << 20, 20.0)
        (end,) = client.get_rows_many([after])
        assert isinstance(end, GetRowsResult)
        assert end.row_count == 0
        assert end.input_ended


def test_a_call_for_a_later_round_acknowledges_at_once_and_answers_with_later_rows(
    tmp_path: Path,
) -> None:
    """A reducer sends its next round's GetRows right after a commit: the mapper frees the
    committed rows on arrival, and answers at the round's start with the rows that came
    meanwhile (not only those it held when the call came)."""
    with serving(
        tmp_path, range(1_000), timeout_seconds=30.0, tuning=ms.Tuning(batch_rows=250)
    ) as (worker, address, client):
        assert worker.ingest_once()  # rows 0-249
        assert worker.ingest_once()  # rows 250-499
        window = worker.window
        assert window is not None
        # The reducer committed rows 0-249; its next round starts in 3 s. Rows 250-499 are
        # there already: answered at once, the call would hold only them.
        call = GetRowsCall(0, address, "m0", 0, 249, 10_000, 1 << 20, 20.0, start_in_seconds=3.0)
        client.prefetch([call])
        deadline = time.monotonic() + 10
        while window.snapshot().buffered_rows != 250:
            assert time.monotonic() < deadline, "the commit never reached the mapper"
            time.sleep(0.01)
        assert worker.ingest_once()  # rows 500-749, while the call waits for the round
        (result,) = client.get_rows_many([call])
        assert isinstance(result, GetRowsResult)
        assert result.row_count == 500
        assert result.last_shuffle_row_index == 749


def test_a_reducer_waiting_after_an_empty_round_wakes_when_its_held_call_is_answered(
    tmp_path: Path,
) -> None:
    """A round that found nothing leaves its call under way (the mapper holds it); the
    reducer's pause after it (:meth:`GrpcRowsClient.wait_for_answer`, here an hour) ends as
    soon as rows reach the mapper, and the next round takes them."""
    with serving(
        tmp_path,
        range(1_000),
        worker_class=CountingMapper,
        timeout_seconds=30.0,
        client_options={"wait_seconds": 0.0, "first_answer_seconds": 0.0},
    ) as (worker, address, client):
        CountingMapper.handled = 0
        call = GetRowsCall(0, address, "m0", 0, -1, 10_000, 1 << 20, 20.0)
        (first,) = client.get_rows_many([call])
        assert isinstance(first, NotAnsweredYet)  # held: no rows yet
        deadline = time.monotonic() + 10
        while CountingMapper.handled == 0:  # the call found the window empty
            assert time.monotonic() < deadline, "the call never reached the mapper"
            time.sleep(0.01)
        pausing = threading.Thread(target=client.wait_for_answer, args=(3600.0,))
        pausing.start()
        try:
            assert pausing.is_alive()
            assert worker.ingest_once()  # rows arrive: the held call is answered
            pausing.join(15)
            assert not pausing.is_alive(), "the pause did not end when the call was answered"
        finally:
            pausing.join(3600)
        # An answer already there ends no further pause (a round that makes no call would
        # otherwise loop without sleeping): the pause lasts its whole timeout.
        began = time.monotonic()
        client.wait_for_answer(0.2)
        assert time.monotonic() - began >= 0.2
        (rows,) = client.get_rows_many([call])
        assert isinstance(rows, GetRowsResult)
        assert rows.row_count == 1_000


def test_the_grpc_client_is_one_a_reducer_can_wait_on() -> None:
    client = GrpcRowsClient(5.0, 1 << 20)
    try:
        assert isinstance(client, AnswerWaiter)
    finally:
        client.close()


def test_the_client_times_the_first_answer_a_round_takes(tmp_path: Path) -> None:
    """:attr:`GrpcRowsClient.first_answer_at` is when the held call was answered: after the
    rows arrived, not when the round began (the reducer's cadence counts from it)."""
    with serving(tmp_path, range(1_000), worker_class=CountingMapper, timeout_seconds=30.0) as (
        worker,
        address,
        client,
    ):
        began = time.monotonic()
        arrived: list[float] = []
        original = worker.ingest_once

        def ingest_once() -> bool:
            arrived.append(time.monotonic())
            return original()

        worker.ingest_once = ingest_once  # type: ignore[method-assign]
        assert _answer_once_rows_arrive(worker, address, client).row_count == 1_000
        answered = client.first_answer_at
        assert answered is not None
        assert began < arrived[0] <= answered <= time.monotonic()
        # A round that took no answer (an acknowledgement is answered, a round without
        # calls takes none) says so.
        client.get_rows_many([])
        assert client.first_answer_at is None
