"""Progress around failed workers (thesis 4.6) and the store-backed queue input."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
from millstream.ledger import read_mapper_state, read_reducer_state, read_statuses
from millstream.runner.local import LocalRunner

from tests.support.jobs import (
    KeyedSumMapper,
    KeyedSumReducer,
    PassThroughMapper,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _read(processor: ms.Processor, fn):  # type: ignore[no-untyped-def]
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        try:
            return fn(txn)
        finally:
            txn.reset()
    finally:
        store.close()


def test_down_mapper_does_not_stop_the_others(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 60_000, partitions=2)
    processor = keyed_processor(data, tmp_path / "state.db")
    runner = LocalRunner(processor)
    runner.start()
    try:
        runner.hold("mapper", 0)
        assert ("mapper", 0, 0) not in runner.pids()

        def mapper1_committed() -> bool:
            runner.poll()
            state = _read(processor, lambda txn: read_mapper_state(txn, 1))
            return state.input_unread_row_index == 30_000

        # Mapper 1's rows get reduced and committed (its persisted state covers its whole
        # partition, which needs every reducer to commit them) while mapper 0 stays down.
        _wait_for(mapper1_committed, 120, "mapper 1's rows to be committed")
        assert ("mapper", 0, 0) not in runner.pids()
        m0 = _read(processor, lambda txn: read_mapper_state(txn, 0))
        assert m0.input_unread_row_index < 30_000
        runner.release("mapper", 0)
        runner.wait(timeout=120)
    finally:
        runner.stop()
    assert read_output(processor, "sum") == expected_sums(data)


def test_down_reducer_bounds_mapper_memory(tmp_path: Path) -> None:
    batch_rows, limit = 2_000, 200_000
    data = write_keyed_input(tmp_path / "in", 60_000, partitions=2)
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=PassThroughMapper,
        tune=tuning(batch_rows=batch_rows, memory_limit_bytes=limit),
    )
    # One batch of (key int64, value int64) rows plus its per-row index overhead.
    one_batch = batch_rows * (16 + 8)
    runner = LocalRunner(processor)
    runner.start()
    try:
        runner.hold("reducer", 0)
        seen: list[int] = []

        def mappers_blocked() -> bool:
            runner.poll()
            statuses = _read(processor, read_statuses)
            mappers = [statuses.get(("mapper", m), {}) for m in range(2)]
            seen.extend(int(s.get("window_bytes", 0)) for s in mappers)
            # A mapper reads on only while a batch like its recent ones fits under the
            # limit (with a quarter to spare): full means within two batches of it.
            return all(int(s.get("window_bytes", 0)) >= limit - 2 * one_batch for s in mappers)

        _wait_for(mappers_blocked, 120, "both mappers to fill their windows")
        for _ in range(10):  # they stay blocked: the input is not read further
            mappers_blocked()
            time.sleep(0.1)
        statuses = _read(processor, read_statuses)
        for m in range(2):
            assert int(statuses[("mapper", m)]["input_end_row_index"]) < 30_000
        assert max(seen) <= limit, "a window went over its memory limit"
        runner.release("reducer", 0)
        runner.wait(timeout=120)
    finally:
        runner.stop()
    assert read_output(processor, "sum") == expected_sums(data)


def test_store_queue_input_is_trimmed_after_commit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = ms.inputs.StoreQueue(url, "events", 2, prefix=("input",))
    processor = ms.Processor(
        mapper=KeyedSumMapper,
        reducer=KeyedSumReducer,
        input=queue,
        store=url,
        num_reducers=2,
        name="queued",
        tuning=tuning(batch_rows=2_000),
    )
    rng = np.random.default_rng(5)
    appended: list[pa.Table] = []
    observations: list[tuple[int, int, int]] = []
    done = threading.Event()

    def produce() -> None:
        for _ in range(20):
            for p in range(2):
                table = pa.table(
                    {
                        "key": rng.integers(0, 500, 2_500, dtype=np.int64),
                        "value": rng.integers(-100, 100, 2_500, dtype=np.int64),
                    }
                )
                queue.append(p, table)
                appended.append(table)
            time.sleep(0.05)
        for p in range(2):
            queue.close_partition(p)

    def observe() -> None:
        while not done.is_set():
            for p in range(2):
                first = queue.first_row_index(p)
                state = _read(processor, lambda txn, p=p: read_mapper_state(txn, p))
                observations.append((p, first, state.input_unread_row_index))
            done.wait(0.1)

    producer = threading.Thread(target=produce)
    observer = threading.Thread(target=observe)
    producer.start()
    observer.start()
    try:
        summary = LocalRunner(processor).run(timeout=180)
    finally:
        producer.join()
        done.set()
        observer.join()
    # Trimming never runs ahead of the persisted state (read after it, so it can only be
    # further along), and the persisted state advanced as rows were committed.
    assert all(first <= persisted for _, first, persisted in observations)
    assert any(persisted > 0 for _, _, persisted in observations)
    for p in range(2):
        assert queue.first_row_index(p) == queue.end_row_index(p) == 50_000
        assert (
            _read(processor, lambda txn, p=p: read_mapper_state(txn, p)).input_unread_row_index
            == 50_000
        )
    assert summary.rows_read == 100_000
    everything = pa.concat_tables(appended).group_by("key").aggregate([("value", "sum")])
    expected = dict(
        zip(everything["key"].to_pylist(), everything["value_sum"].to_pylist(), strict=True)
    )
    assert read_output(processor, "sum") == expected
    reducers = _read(processor, lambda txn: [read_reducer_state(txn, r, 2) for r in range(2)])
    assert all(r.committed_row_indices for r in reducers)
    queue.close()


def test_a_second_run_reports_its_own_rate(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 20_000)
    processor = keyed_processor(data, tmp_path / "state.db")
    first = ms.run_local(processor, timeout=120)
    assert first.rows_read == 20_000
    assert first.rows_read_before == 0
    assert "in this run" not in str(first)
    second = ms.run_local(processor, timeout=120)  # the input is already drained
    assert (second.rows_read, second.rows_read_before) == (20_000, 20_000)
    assert "20,000 rows read (0 in this run)" in str(second)
    assert "(0 rows/s, 0.0 MB/s shuffled)" in str(second)
    assert read_output(processor, "sum") == expected_sums(data)
