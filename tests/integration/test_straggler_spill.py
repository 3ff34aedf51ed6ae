"""Straggler spill end to end: one reducer down, the other keeps committing, the missing
one's rows wait in the store, and the results are exact after it returns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from millstream.ledger import reduced_key
from millstream.ledger.spill import spill_pending
from millstream.runner.local import LocalRunner
from millstream.state import decode_int64

from tests.support.jobs import (
    SlowKeyedSumMapper,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)


def _committed_rows(store: object, reducer: int) -> int:
    with store.read() as txn:  # type: ignore[attr-defined]
        raw = txn.get(reduced_key(reducer, "rows"), snapshot=True)
    return 0 if raw is None else decode_int64(raw)


def _pending(store: object, reducer: int) -> bool:
    with store.read() as txn:  # type: ignore[attr-defined]
        return spill_pending(txn, reducer)


@pytest.mark.slow
def test_a_reducer_down_does_not_stop_the_others(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 240_000, partitions=2, file_rows=10_000)
    processor = keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowKeyedSumMapper,
        config={"map_seconds": 0.02},
        # A window of a few batches fills within a second of the reducer stopping.
        tune=tuning(batch_rows=2_000, memory_limit_bytes=100_000, spill_after_seconds=0.2),
    )
    runner = LocalRunner(processor)
    runner.start()
    store = processor.open_store()
    try:
        deadline = time.monotonic() + 60
        while ("reducer", 1, 0) not in runner.pids() or _committed_rows(store, 1) == 0:
            assert time.monotonic() < deadline, "reducer 1 never committed"
            time.sleep(0.05)
        runner.hold("reducer", 1)
        try:
            stopped_at = _committed_rows(store, 0)
            deadline = time.monotonic() + 60
            # Reducer 0's share of the shuffled rows is about 50,000; its windows hold a few
            # thousand, so 20,000 more can only be committed if the mappers spilled.
            while not (_pending(store, 1) and _committed_rows(store, 0) > stopped_at + 20_000):
                assert time.monotonic() < deadline, (
                    "with reducer 1 down, reducer 0 committed "
                    f"{_committed_rows(store, 0) - stopped_at} rows and spill pending is "
                    f"{_pending(store, 1)}"
                )
                time.sleep(0.05)
        finally:
            runner.release("reducer", 1)
        runner.wait(timeout=300)
        assert not _pending(store, 1), "the returned reducer left spilled rows behind"
    finally:
        store.close()
    assert read_output(processor, "sum") == expected_sums(data)
