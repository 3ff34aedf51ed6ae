"""A store queue append that changes the partition's schema, failed at each statement of
its commit (and then a trim past the change, failed likewise): the partition holds all of
the append (rows and :mod:`millstream.inputs.queue_schemas` records) or none of it, a
retry lands it once, and every read returns rows in the schema they were appended in."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from millstream.exceptions import StoreError
from millstream.inputs import StoreQueue

from tests.support.sqlite_faults import FAULTS, PLAN, open_faulty

BASE = pa.record_batch({"k": pa.array([1, 2, 3], pa.int32()), "s": ["a", "b", "c"]})
WIDER = pa.record_batch(
    {"extra": pa.array([None, 1.5]), "k": pa.array([4, 5], pa.int64()), "s": ["d", "e"]}
)
LATER = pa.record_batch({"k": pa.array([6], pa.int64()), "s": ["f"]})
"""Appended after ``WIDER``: ``extra`` left out again, a safe change too."""

APPENDS = [BASE, WIDER, LATER]


def _check_reads(queue: StoreQueue, first: int) -> None:
    """Every row from ``first`` on reads back in its append's schema, each read within one."""
    begin, last = 0, queue.end_row_index(0)
    for batch in APPENDS:
        end = begin + batch.num_rows
        if end > last:
            return
        for row in range(max(begin, first), end):
            got = queue.read(0, row, 10).batch
            assert got is not None
            assert got.schema.equals(batch.schema)
            assert got.equals(batch.slice(row - begin, end - row))
        begin = end


def _steps(path: Path, fail_at: int | None, kind: str) -> int:
    """Append ``BASE``, then ``WIDER`` failing step ``fail_at`` of its commit (retrying
    once if it failed), ``LATER``, then trim past the change failing likewise; returns the
    steps the failing part took."""
    store = open_faulty(path)
    try:
        queue = StoreQueue(store, "q", 1)
        queue.append_as(0, BASE, "producer", 0)
        PLAN.arm(fail_at, kind)
        try:
            queue.append_as(0, WIDER, "producer", 1)
        except StoreError:
            assert PLAN.fired
            PLAN.arm(None)
            assert queue.end_row_index(0) in (3, 5), "all of the append or none"
            _check_reads(queue, 0)
            queue.append_as(0, WIDER, "producer", 1)  # the retry lands it once
        steps = PLAN.steps
        PLAN.arm(None)
        queue.append_as(0, LATER, "producer", 2)
        assert queue.end_row_index(0) == 6
        _check_reads(queue, 0)
        PLAN.arm(fail_at, kind)
        try:
            queue.trim(0, 4)
        except StoreError:
            PLAN.arm(None)
            _check_reads(queue, queue.first_row_index(0))
            queue.trim(0, 4)
        PLAN.arm(None)
        _check_reads(queue, 4)
        return steps
    finally:
        PLAN.arm(None)
        store.close()


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_an_evolving_append_and_a_trim_fail_at_each_step(tmp_path: Path, kind: str) -> None:
    steps = _steps(tmp_path / "count.db", None, kind)
    assert steps > 3
    for at in range(steps):
        _steps(tmp_path / f"{at}.db", at, kind)
