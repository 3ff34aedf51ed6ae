"""GetRows between real worker processes: a frozen mapper holds nobody, and a forged
request from outside the processor loses no row."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import millstream as ms
from millstream.ledger import list_workers, read_reducer_state, read_statuses
from millstream.rpc import millstream_pb2, millstream_pb2_grpc
from millstream.runner.local import LocalRunner

from tests.support.jobs import (
    SlowKeyedSumMapper,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)


def _read(processor: ms.Processor, fn: Callable):  # type: ignore[no-untyped-def,type-arg]
    store = processor.open_store()
    try:
        with store.read() as txn:
            return fn(txn)
    finally:
        store.close()


def _committed(processor: ms.Processor, mapper: int) -> int:
    """Rows of ``mapper`` committed, summed over reducers (shuffle indices + 1)."""
    return _read(
        processor,
        lambda txn: sum(
            read_reducer_state(txn, r, processor.num_partitions).committed_row_indices[mapper] + 1
            for r in range(processor.num_reducers)
        ),
    )


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _freeze_outside_a_store_write(pid: int, db: Path) -> None:
    """SIGSTOP ``pid`` at a moment it holds no SQLite write lock: a process frozen inside
    a write transaction of the embedded store holds every writer (FoundationDB would
    abort its transaction after 5 s instead), which is not what this test is about."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(db, timeout=1.0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:  # still locked after a second: the frozen one
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
        finally:
            probe.close()
    raise AssertionError(f"process {pid} held the store's write lock at every try")


def test_a_frozen_mapper_holds_nobody_and_the_results_stay_exact(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 120_000, partitions=2, file_rows=3_000)
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowKeyedSumMapper,
        config={"map_seconds": 0.05},
        # Commit as rows come, without gathering a backlog first: mapper 0 must still be
        # reading when it is frozen.
        tune=tuning(rpc_timeout_seconds=30.0, gather_seconds=0.0),
    )
    runner = LocalRunner(processor)
    runner.start()
    try:
        _wait_for("mapper 0's first commits", lambda: _committed(processor, 0) > 0)
        pid = runner.pids()[("mapper", 0, 0)]
        _freeze_outside_a_store_write(pid, tmp_path / "state.db")
        try:
            before = _committed(processor, 1)
            # While mapper 0 is frozen (its GetRows calls stay unanswered for up to 30 s),
            # the reducers keep committing mapper 1's rows.
            _wait_for(
                "mapper 1's rows committed while mapper 0 is frozen",
                lambda: _committed(processor, 1) > before + 6_000,
                timeout=25.0,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        summary = runner.wait(timeout=120)
    finally:
        runner.stop()
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == 120_000


def _forge(address: str, guid: str, reducer: int, committed: int) -> None:
    """A GetRows sent by someone outside the processor who saw the mapper's GUID."""
    with grpc.insecure_channel(address) as channel:
        millstream_pb2_grpc.MapperStub(channel).GetRows(
            millstream_pb2.GetRowsRequest(
                count=0,
                reducer_index=reducer,
                committed_row_index=committed,
                mapper_guid=guid,
                max_bytes=1,
            ),
            timeout=5,
        )


def test_a_forged_get_rows_loses_no_row(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 90_000, partitions=2, file_rows=3_000)
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowKeyedSumMapper,
        config={"map_seconds": 0.03},
        # Commit as rows come, without gathering a backlog first: the mapper must still be
        # reading when the forged call reaches it.
        tune=tuning(gather_seconds=0.0),
    )
    runner = LocalRunner(processor)
    runner.start()
    try:
        _wait_for("the first commits", lambda: _committed(processor, 0) > 0)
        (mapper,) = [
            w for w in _read(processor, lambda t: list_workers(t, "mapper")) if w.index == 0
        ]
        # Claims that reducer 1 committed every row the mapper will ever make: the window
        # drops its rows for reducer 1 (before, the mapper then persisted its state past
        # them and trimmed its input: reducer 1's sums came out short).
        _forge(mapper.address, mapper.guid, 1, 10**9)
        summary = runner.wait(timeout=120)
    finally:
        runner.stop()
    assert read_output(processor, "sum") == expected_sums(data)
    # The mapper noticed the claim beyond the store and restarted from its persisted state.
    status = _read(processor, read_statuses)[("mapper", 0)]
    assert "committed only up to" in str(status["last_error"])
    assert summary.rows_read == 90_000
