"""Commits whose outcome is unknown, replayed step by step in the simulation (issue 13).

Three kinds, as FoundationDB can report them: applied then reported unknown
(``unknown``), never applied (``unknown_unapplied``), and still in flight when reported,
landing after the worker has looked (``unknown_late``).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pyarrow as pa
import pytest
from millstream.exceptions import (
    CommitUnknownResultError,
    DuplicateSequenceError,
    InputError,
    StoreUnavailableError,
)
from millstream.inputs import queue_chunks, store_queue
from millstream.inputs.store_queue import StoreQueue
from millstream.state import encode_int64

from tests.support.simulation import Action, SimConfig, Simulation, replay

CONFIG = SimConfig(totals=(4, 6), num_reducers=2, batch_rows=4, commit_max_rows=8)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="millstream")


@pytest.mark.parametrize("fault", ["unknown", "unknown_unapplied", "unknown_late"])
def test_a_plain_append_retried_after_an_unknown_result_lands_once(fault: str) -> None:
    sim = Simulation(CONFIG)
    try:
        queue = StoreQueue(sim.store, "plain", 1)  # type: ignore[arg-type]
        sim.plan.armed.append(fault)
        begin, end = queue.append(0, pa.record_batch({"row": pa.array([1, 2, 3])}))
        sim.plan.land()
        stored = StoreQueue(sim.raw, "plain", 1).read(0, 0, 100).batch
        assert stored is not None
        assert stored.column("row").to_pylist() == [1, 2, 3]
        assert (begin, end) == (0, 3)
    finally:
        sim.close()


def test_a_producer_repeating_its_sequence_after_a_restart_appends_once() -> None:
    sim = Simulation(CONFIG)
    try:
        queue = StoreQueue(sim.raw, "named", 1)
        batch = pa.record_batch({"row": pa.array([7, 8])})
        assert queue.producer("p").append(0, batch, sequence=0) == (0, 2)
        restarted = queue.producer("p")
        assert restarted.last_sequence(0) == 0
        assert restarted.append(0, batch, sequence=0) == (0, 2)  # the last one: its range
        assert restarted.append(0, batch) == (2, 4)  # resumes at sequence 1
        with pytest.raises(DuplicateSequenceError, match="resume at sequence 2"):
            restarted.append(0, batch, sequence=0)
        assert queue.end_row_index(0) == 4
    finally:
        sim.close()


def test_an_append_of_several_pieces_stopped_between_them_is_completed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 42, item 2: a sequence counts as appended once all its pieces landed."""
    monkeypatch.setattr(queue_chunks, "CHUNK_BYTES", 80)  # 10 int64 rows a chunk
    monkeypatch.setattr(store_queue, "TRANSACTION_BYTES", 1)  # a transaction per chunk
    sim = Simulation(CONFIG)
    try:
        queue = StoreQueue(sim.store, "pieces", 1)  # type: ignore[arg-type]
        batch = pa.record_batch({"row": pa.array(range(35))})
        sim.plan.armed.extend(["none", "unavailable"])  # the second piece fails
        with pytest.raises(StoreUnavailableError):
            queue.producer("p").append(0, batch, sequence=0)
        assert queue.end_row_index(0) == 10  # the first piece is readable
        restarted = queue.producer("p")
        assert restarted.last_sequence(0) == -1
        with pytest.raises(InputError, match="append sequence 0 again with the same rows"):
            restarted.append(0, pa.record_batch({"row": pa.array(range(100, 135))}), sequence=1)
        with pytest.raises(InputError, match="cannot append other rows as sequence 0"):
            restarted.append(0, pa.record_batch({"row": pa.array(range(100, 135))}), sequence=0)
        with pytest.raises(InputError, match="complete it before sealing"):
            queue.close_partition(0)  # the rest of sequence 0 would be lost
        assert restarted.append(0, batch, sequence=0) == (0, 35)
        assert restarted.last_sequence(0) == 0
        assert restarted.append(0, batch, sequence=0) == (0, 35)
        assert restarted.append(0, pa.record_batch({"row": pa.array([35])})) == (35, 36)
        rows: list[int] = []
        while (read := queue.read(0, len(rows), 1000).batch) is not None:
            rows.extend(read.column("row").to_pylist())
        assert rows == list(range(36))
        assert queue.close_partition(0) == 36
    finally:
        sim.close()


def test_transact_does_not_rerun_a_body_not_declared_idempotent() -> None:
    sim = Simulation(CONFIG)
    try:

        def increment(txn: Any) -> None:
            txn.add(("n",), 1)

        sim.plan.armed.append("unknown")
        with pytest.raises(CommitUnknownResultError, match=r"idempotent=True"):
            sim.store.transact(increment)
        assert sim.raw.transact(lambda txn: txn.get(("n",))) == encode_int64(1)

        def overwrite(txn: Any) -> None:
            txn.set(("k",), b"v")

        sim.plan.armed.append("unknown")
        sim.store.transact(overwrite, idempotent=True)
        assert sim.raw.transact(lambda txn: txn.get(("k",))) == b"v"
    finally:
        sim.close()


APPENDS: list[Action] = [
    ("append", 0, 3, ("unknown",)),
    ("append", 0, 2, ("unknown_late",)),
    ("append", 1, 2, ("unknown_unapplied", "unknown_late")),
    ("append", 1, 1, ("unknown_late", "conflict"), True),
    ("store_down", True),
    ("append", 0, 1, ()),
    ("append", 1, 1, (), True),
    ("store_down", False),
    ("append", 0, 2, ("unknown_late",), True),
]


def test_producer_appends_under_every_unknown_result_land_once() -> None:
    outcome = replay(CONFIG, APPENDS)  # checks the queue after every step, and at the end
    trace = "\n".join(outcome.trace)
    for what in (
        "store fault: unknown_late",
        "store fault: unknown_unapplied",
        "in-flight commit lands",
        "resumes at seq",
        "cannot resume yet",
        "StoreUnavailableError",
    ):
        assert what in trace, f"the steps never reached {what!r}"


def test_a_state_commit_that_lands_after_its_check_still_trims_the_input() -> None:
    # Mapper 0 maps all four rows and both reducers commit them. Its state commit is still
    # in flight when reported unknown; the mapper looks, sees it not applied, and gives
    # up; then the commit lands. Instances started later begin at that state, with
    # nothing left to persist: they must still trim the input there.
    steps: list[Action] = [
        ("produce", 0, 2),
        ("ingest", 0, 0),
        ("reduce", 0, 0, (), (), (), False),
        ("reduce", 1, 0, (), (), (), False),
        ("commit_fault", "unknown_late", 1),
        ("trim", 0, 0),
        ("ingest", 1, 0),  # its commit lands the one in flight
        ("restart_mapper", 0, 0),
        ("trim", 0, 0),
    ]
    outcome = replay(CONFIG, steps)  # the drain checks every partition is trimmed to its end
    trace = "\n".join(outcome.trace)
    assert "in-flight commit lands" in trace


def test_a_large_append_interrupted_between_pieces_resumes_without_duplicates() -> None:
    # About 9 MB: three transactions. The second one fails; repeating the append with its
    # sequence skips the piece that landed and appends the rest.
    sim = Simulation(CONFIG)
    try:
        queue = StoreQueue(sim.store, "large", 1)  # type: ignore[arg-type]
        rows = 90_000
        pad = random.Random(7).randbytes(92 * rows)  # incompressible: stored at its size
        batch = pa.record_batch(
            {
                "row": pa.array(range(rows)),
                "pad": pa.array([pad[92 * i : 92 * i + 92] for i in range(rows)], pa.binary()),
            }
        )
        producer = queue.producer("bulk")
        sim.plan.armed.extend([None, "unavailable"])  # type: ignore[list-item]
        with pytest.raises(StoreUnavailableError):
            producer.append(0, batch, sequence=0)
        landed = queue.end_row_index(0)
        assert 0 < landed < rows
        assert producer.append(0, batch, sequence=0) == (0, rows)
        stored = StoreQueue(sim.raw, "large", 1)
        got: list[int] = []
        while (part := stored.read(0, len(got), rows).batch) is not None:
            got.extend(part.column("row").to_pylist())
        assert got == list(range(rows))
    finally:
        sim.close()
