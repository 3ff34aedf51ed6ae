"""Straggler spill driven step by step in one process: a reducer that does not run, a
mapper whose window fills, the rows only that reducer needs written to the store, and the
reducer committing them from there exactly once."""

from __future__ import annotations

from pathlib import Path

from millstream.ledger import read_mapper_state
from millstream.ledger.spill import spill_pending, spilled_through

from tests.support.worker_fixtures import ROWS_PER_PARTITION, AddCounts, Cluster, PreAggregating
from tests.support.worker_fixtures import expected_counts as _expected
from tests.support.worker_fixtures import tables as _tables

# About 2 KB per mapped batch of 100 rows: 3 batches fill the window.
LIMIT = 6_000
SPILL_AFTER = 5.0


def _fill(c: Cluster, batches: int) -> None:
    """Every mapper ingests while there is room; only reducer 0 commits."""
    for _ in range(batches):
        for mapper in c.mappers.values():
            if mapper.window is not None and mapper.window.wait_for_room(0):
                mapper.ingest_once()
        c.reducers[0].run_once()
        for mapper in c.mappers.values():
            mapper.trim_input_rows()


def test_a_full_window_spills_the_stragglers_rows_and_reads_on(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), memory_limit_bytes=LIMIT, spill_after_seconds=SPILL_AFTER)
    mapper = c.mappers[0]
    _fill(c, 10)
    assert mapper.window is not None
    assert not mapper.window.wait_for_room(0), "reducer 1 never committed: the window is full"
    read_before = mapper.window.snapshot().input_end_row_index
    persisted_before = mapper.persisted.input_unread_row_index
    # Reducer 1 has not called for spill_after_seconds: a straggler.
    assert mapper.spill_stragglers() == 0
    c.clock.advance(SPILL_AFTER)
    c.reducers[0].run_once()
    assert mapper.stragglers() == [1]
    assert mapper.spill_stragglers() > 0
    assert mapper.window.wait_for_room(0)
    with c.store.read() as txn:
        assert spill_pending(txn, 1)
        assert not spill_pending(txn, 0), "rows reducer 0 committed are never spilled"
        assert spilled_through(txn, 1, 0) == mapper.window.spilled_row_index(1)
    mapper.trim_input_rows()
    assert mapper.persisted.input_unread_row_index > persisted_before
    _fill(c, 10)
    assert mapper.window.snapshot().input_end_row_index > read_before
    # The straggler returns: it reads its rows from the store first, then the windows.
    c.run_to_end()
    assert c.output() == _expected(c.tables)
    with c.store.read() as txn:
        assert not spill_pending(txn, 1), "committed spill chunks are cleared"


def test_nothing_is_spilled_while_every_reducer_is_behind(tmp_path: Path) -> None:
    c = Cluster(tmp_path, _tables(), memory_limit_bytes=LIMIT)
    for _ in range(10):
        for mapper in c.mappers.values():
            if mapper.window is not None and mapper.window.wait_for_room(0):
                mapper.ingest_once()
    # Even named stragglers: nobody has moved past the oldest entry.
    assert c.mappers[0].spill_stragglers([0, 1]) == 0
    c.run_to_end()
    assert c.output() == _expected(c.tables)


def test_a_restarted_mapper_does_not_buffer_spilled_rows_again(tmp_path: Path) -> None:
    c = Cluster(
        tmp_path, _tables(), memory_limit_bytes=LIMIT, mapper=PreAggregating, reducer=AddCounts
    )
    _fill(c, 10)
    old = c.mappers[0]
    assert old.spill_stragglers([1]) > 0
    assert old.window is not None
    spilled = old.window.spilled_row_index(1)
    # Before any trim persists past the spilled rows, the mapper dies and restarts.
    fresh = c.start_mapper(0)
    with c.store.read() as txn:
        assert read_mapper_state(txn, 0).input_unread_row_index < ROWS_PER_PARTITION
    assert fresh.window is not None
    assert fresh.window.spilled_row_index(1) == spilled
    c.run_to_end()
    assert c.output("n") == _expected(c.tables)
