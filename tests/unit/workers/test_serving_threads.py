"""The mapper's serving state under threads (issue 42 item 6): a GetRows that runs while the
ingestion thread restarts the window loses no claim, and ``fetched_all`` never answers from
one window's end of input and another window's bucket.

The first test drives the interleaving deterministically: it pauses the ingestion thread
before every statement of ``start_ingestion`` (and of the mapper's code it calls) and runs a
forged GetRows and ``fetched_all`` from another thread right there. The second runs real
threads against each other for a bounded number of restarts.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import millstream as ms
import millstream.workers as workers_package
import pyarrow as pa
import pytest
from millstream.exceptions import MillstreamError, WindowLostRowsError
from millstream.ledger import read_mapper_state
from millstream.testing import MemoryInput
from millstream.workers import MapperWorker

ROWS = 300
BATCH = 100
FORGED = 10**9
"""A committed index no reducer reached: it claims every row the mapper will ever make."""

WORKERS_DIR = str(Path(workers_package.__file__).parent)


class ByKey(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="key", num_reducers=self.spec.num_reducers)


class Count(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        txn.add(("rows",), batch.num_rows)


def _mapper(tmp_path: Path, name: str) -> MapperWorker:
    """A mapper (one reducer, nothing committed) that has read its whole input once."""
    table = pa.table({"key": pa.array(range(ROWS), pa.int64())})
    processor = ms.Processor(
        mapper=ByKey,
        reducer=Count,
        input=MemoryInput([table]),
        store=f"sqlite:///{tmp_path / f'{name}.db'}",
        num_reducers=1,
        tuning=ms.Tuning(batch_rows=BATCH),
    )
    worker = MapperWorker(processor, 0, processor.open_store(), guid=f"guid-{name}")
    worker.start_ingestion()
    _read_all(worker)
    return worker


def _read_all(worker: MapperWorker) -> None:
    while not worker.end_of_input:
        worker.ingest_once()


def _persisted_shuffle_index(worker: MapperWorker) -> int:
    with worker.store.read() as txn:
        return read_mapper_state(txn, worker.index).shuffle_unread_row_index


def _close(worker: MapperWorker) -> None:
    store = worker.store
    worker.close()
    store.close()


@pytest.fixture
def traced() -> Iterator[Callable[[Callable[[], None], Callable[[int], None]], None]]:
    """Run a function with a callback before each statement it runs in the workers'
    code (the callback gets the statement's number, counting from 0)."""
    previous = sys.gettrace()

    def run(fn: Callable[[], None], before: Callable[[int], None]) -> None:
        count = 0

        def trace(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal count
            if not frame.f_code.co_filename.startswith(WORKERS_DIR):
                return None  # the store, the ledger, pyarrow: not traced line by line
            if event == "line":
                before(count)
                count += 1
            return trace

        sys.settrace(trace)
        try:
            fn()
        finally:
            sys.settrace(previous)

    yield run
    sys.settrace(previous)


def test_get_rows_at_every_point_of_a_window_restart_loses_no_claim(
    tmp_path: Path,
    traced: Callable[[Callable[[], None], Callable[[int], None]], None],
) -> None:
    """Before each statement of a restart, another thread sends a forged GetRows (a claim
    of every row, which pops the bucket) and asks ``fetched_all``. Whatever window the
    claim lands on, the mapper must not persist past rows no reducer committed (it may
    refuse: :class:`WindowLostRowsError`), and ``fetched_all`` (asked before the forged
    call pops anything) must never say the input ended: no reducer has any row yet."""
    probe = _mapper(tmp_path, "probe")
    statements: list[int] = []
    traced(probe.start_ingestion, statements.append)
    _close(probe)
    assert len(statements) > 5

    failures: list[str] = []
    for point in statements:
        worker = _mapper(tmp_path, f"at-{point}")
        answers: list[bool] = []
        hostile: list[threading.Thread] = []

        def forge(worker: MapperWorker = worker, answers: list[bool] = answers) -> None:
            answers.append(worker.fetched_all(0, -1))
            with contextlib.suppress(MillstreamError):  # a closed window refuses it
                worker.handle_get_rows(0, FORGED, 0, 1 << 20, worker.guid)

        def before(
            count: int, point: int = point, hostile: list[threading.Thread] = hostile
        ) -> None:
            if count != point:
                return
            thread = threading.Thread(target=forge)
            thread.start()
            thread.join(5.0)  # still running: blocked by the ingestion thread, joined below
            hostile.append(thread)

        traced(worker.start_ingestion, before)
        for thread in hostile:
            thread.join()
        _read_all(worker)
        # WindowLostRowsError: the claim was seen (the mapper restarts from its state).
        with contextlib.suppress(WindowLostRowsError):
            worker.trim_input_rows()
        persisted = _persisted_shuffle_index(worker)
        if persisted > 0:
            failures.append(
                f"statement {point}: persisted past shuffle index {persisted - 1}, "
                "which no reducer committed (the forged claim was lost)"
            )
        if any(answers):
            failures.append(f"statement {point}: fetched_all said the input ended {answers}")
        _close(worker)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("hostile", ["forged_claims", "fetched_all"])
def test_window_restarts_under_real_threads(tmp_path: Path, hostile: str) -> None:
    """The ingestion thread restarts the window again and again (bounded: a few hundred
    restarts, a few seconds) while another thread sends forged claims of every row, or
    asks ``fetched_all``, as fast as it can, with the interpreter switching threads as
    often as it can. No reducer ever commits: the mapper must never persist past a row,
    and ``fetched_all`` must never say that the input ended while a reducer has rows to
    come (nothing pops them when only ``fetched_all`` is asked)."""
    worker = _mapper(tmp_path, hostile)
    stop = threading.Event()
    said_ended: list[int] = []

    def attack() -> None:
        while not stop.is_set():
            if hostile == "forged_claims":
                with contextlib.suppress(MillstreamError):  # a closed window refuses it
                    worker.handle_get_rows(0, FORGED, 0, 1 << 20, worker.guid)
            elif worker.fetched_all(0, -1):
                said_ended.append(restarts)
                return

    restarts, refused = 0, 0
    interval = sys.getswitchinterval()
    thread = threading.Thread(target=attack)
    sys.setswitchinterval(1e-6)
    thread.start()
    try:
        deadline = 3.0 + _now()
        while restarts < 400 and _now() < deadline and not said_ended:
            restarts += 1
            worker.start_ingestion()
            _read_all(worker)
            try:
                worker.trim_input_rows()
            except WindowLostRowsError:
                refused += 1
            assert _persisted_shuffle_index(worker) == 0, (
                f"restart {restarts}: persisted past rows no reducer committed"
            )
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
        _close(worker)
    assert not said_ended, f"fetched_all said the input ended during restarts {said_ended}"
    if hostile == "forged_claims":
        assert refused > 0, "no forged claim reached a window the mapper tried to persist"


def _now() -> float:
    return time.monotonic()
