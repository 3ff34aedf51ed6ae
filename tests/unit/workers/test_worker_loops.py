"""The serving layer in one process: ``run_worker`` in threads, real gRPC, SQLite.

Faster than the process-level integration tests, and it reaches the run loops' error
handling (retries of user errors, stop events) directly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import millstream as ms
import pytest
from millstream.exceptions import StoreUnavailableError, UserCodeError
from millstream.ledger import OUTPUT, list_workers, read_statuses
from millstream.state import decode_int64
from millstream.workers import run_worker

from tests.support.worker_fixtures import (
    CountRows,
    MemoryInput,
    PassThrough,
    expected_counts,
    tables,
)

FAST = ms.Tuning(
    batch_rows=100,
    commit_interval_seconds=0.02,
    trim_period_seconds=0.05,
    heartbeat_seconds=0.05,
    backoff_seconds=0.01,
    backoff_max_seconds=0.05,
    split_brain_delay_seconds=0.02,
)


def _processor(
    tmp_path: Path,
    *,
    bounded: bool = True,
    config: dict[str, object] | None = None,
    tuning: ms.Tuning = FAST,
) -> ms.Processor:
    return ms.Processor(
        mapper=PassThrough,
        reducer=CountRows,
        input=MemoryInput(tables(), bounded=bounded),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=2,
        config=config or {},
        tuning=tuning,
    )


def _run_all(
    processor: ms.Processor, stop: threading.Event, timeout: float = 60
) -> list[BaseException]:
    """Run every worker in a thread until they return; the errors they raised."""
    errors: list[BaseException] = []

    def target(role: str, index: int) -> Callable[[], None]:
        def run() -> None:
            try:
                run_worker(processor, role, index, stop)
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        return run

    threads = [
        threading.Thread(target=target(role, i), name=f"{role}-{i}")
        for role, n in (("mapper", processor.num_mappers), ("reducer", processor.num_reducers))
        for i in range(n)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stop.set()
    for thread in threads:
        thread.join()
    return errors


def _counts(processor: ms.Processor) -> dict[int, int]:
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        rows = txn.get_range_startswith((*OUTPUT, "n"))
        txn.reset()
    finally:
        store.close()
    return {key[-1]: decode_int64(value) for key, value in rows}


def test_workers_in_threads_drain_exactly(tmp_path: Path) -> None:
    processor = _processor(tmp_path)
    stop = threading.Event()
    assert _run_all(processor, stop) == []
    assert _counts(processor) == expected_counts(tables())
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        assert list_workers(txn, "mapper") == []  # workers leave discovery when done
        statuses = read_statuses(txn)
        txn.reset()
    finally:
        store.close()
    assert int(statuses[("mapper", 0)]["rows_read"]) == 1_000
    assert int(statuses[("reducer", 0)]["commits"]) >= 1


class _DownAtStart:
    """A real store whose first ``down`` transactions fail as unavailable (a store that
    is down when a worker starts, up again a moment later)."""

    def __init__(self, inner: ms.state.Store, down: int) -> None:
        self._inner = inner
        self.down = down

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def transact(self, fn: Callable[..., object], **kwargs: object) -> object:
        if self.down > 0:
            self.down -= 1
            raise StoreUnavailableError("injected: the store is down")
        return self._inner.transact(fn, **kwargs)  # type: ignore[arg-type]


def test_a_store_down_at_the_workers_start_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor = _processor(tmp_path)
    opened: list[_DownAtStart] = []
    real_open = type(processor).open_store

    def open_store(self: ms.Processor) -> object:
        store = _DownAtStart(real_open(self), down=3)
        opened.append(store)
        return store

    monkeypatch.setattr(type(processor), "open_store", open_store)
    assert _run_all(processor, threading.Event()) == []
    monkeypatch.undo()
    assert len(opened) >= 4, "every worker opened its store"
    assert all(store.down == 0 for store in opened[:4]), "each waited its outage out"
    assert _counts(processor) == expected_counts(tables())


def test_user_errors_are_retried_when_configured(tmp_path: Path) -> None:
    tuning = dataclasses.replace(FAST, on_user_error="retry")
    processor = _processor(tmp_path, config={"flaky": 3}, tuning=tuning)
    assert _run_all(processor, threading.Event()) == []
    assert _counts(processor) == expected_counts(tables())


def test_user_errors_stop_the_worker_by_default(tmp_path: Path) -> None:
    processor = _processor(tmp_path, config={"flaky": 1})
    errors = _run_all(processor, threading.Event())
    assert errors
    assert all(isinstance(e, UserCodeError) for e in errors)
    assert any("raised on input rows [0, 100)" in str(e) for e in errors)


def test_stop_event_ends_workers_over_unbounded_input(tmp_path: Path) -> None:
    processor = _processor(tmp_path, bounded=False)
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    assert _run_all(processor, stop) == []
    timer.cancel()
    counts = _counts(processor)
    assert sum(counts.values()) <= 2_000
    assert all(counts.get(k, 0) <= n for k, n in expected_counts(tables()).items())


def test_run_worker_rejects_bad_roles_and_indices(tmp_path: Path) -> None:
    processor = _processor(tmp_path)
    with pytest.raises(ValueError, match="role must be one of"):
        run_worker(processor, "combiner", 0)
    with pytest.raises(ValueError, match="reducer index 2 out of range"):
        run_worker(processor, "reducer", 2)


def test_rows_appended_after_idle_spells_are_committed_exactly_once(tmp_path: Path) -> None:
    """Idle mappers of a store queue wait for appends with a growing timeout, and idle
    reducers on the calls their mappers hold: rows appended in bursts between quiet
    spells longer than every timeout (0.1 s) wake them, and each is committed once."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = ms.inputs.StoreQueue(url, "in", 2)
    processor = ms.Processor(
        mapper=PassThrough,
        reducer=CountRows,
        input=queue,
        store=url,
        num_reducers=2,
        tuning=dataclasses.replace(FAST, idle_seconds=0.005),
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    runner = threading.Thread(target=lambda: errors.extend(_run_all(processor, stop)))
    bursts = [tables() for _ in range(3)]
    runner.start()
    try:
        for burst in bursts:
            stop.wait(0.5)  # a quiet spell: every idle timeout grows to its cap
            for partition, table in enumerate(burst):
                queue.append(partition, table)
        for partition in range(2):
            queue.close_partition(partition)
        runner.join(60)
    finally:
        stop.set()
        runner.join()
        queue.close()
    assert errors == []
    expected = expected_counts([table for burst in bursts for table in burst])
    assert _counts(processor) == expected
