"""At-least-once delivery: targeted replays of the races its two guards exist for.

The property-based machine (``TestAtLeastOnce`` in ``test_protocol_machines.py``) runs
every step and fault with ``delivery="at_least_once"`` and checks that nothing is lost;
these replays reach one race each on purpose and show that the guard decides it.
"""

from __future__ import annotations

import pytest
from millstream.workers import ReducerWorker

from tests.support.simulation import SimConfig, replay
from tests.support.simulation.mutants import commit_without_numbering_check

# One mapper over 8 rows (4 visible at first), batches of up to 3 rows, a combining map:
# the first instance cuts [0, 3) and [3, 4) before the rest arrives, its successor cuts
# [0, 3), [3, 6) and [6, 8), so the two number the same shuffle indices differently.
CONFIG = SimConfig(
    totals=(8,),
    num_reducers=1,
    batch_rows=3,
    commit_max_rows=2,
    preaggregate=True,
    delivery="at_least_once",
)

# The reducer fetches the first instance's shuffle rows 0-1 (input rows 0-3); before it
# commits them, the mapper restarts and its new instance takes over the numbering.
STALE_COMMIT = [
    ("ingest", 0, 0),
    ("ingest", 0, 0),
    ("produce", 0, 4),
    ("reduce", 0, 0, (), (), (("restart_mapper", 0, 0),), False),
]


def test_rows_of_a_superseded_instance_are_not_committed() -> None:
    outcome = replay(CONFIG, STALE_COMMIT)
    trace = outcome.trace
    served = trace.index("  m0@m0-0001 served r0 (-1, 1] 2 rows")
    assert trace[served + 1] == "kill m0@m0-0001"
    # The fetch from the superseded instance commits nothing ...
    assert "r0@r0-0002 reduce: False ReducerState(committed_row_indices=(-1,))" in trace
    # ... and the run drains through the new instance, every row applied (replay checks
    # the invariants after every step and at the end).
    assert "drained" in trace


def test_without_the_numbering_check_rows_are_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ReducerWorker, "_reduce_and_commit", commit_without_numbering_check)
    # The stale commit claims shuffle rows 0-1, which the new instance's numbering gives to
    # input rows 0-5: rows 4 and 5 are never applied.
    with pytest.raises(AssertionError, match=r"passed rows whose effect is not committed"):
        replay(CONFIG, STALE_COMMIT)


def test_a_restarted_mapper_numbers_above_every_committed_index() -> None:
    steps = [
        ("ingest", 0, 0),
        ("ingest", 0, 0),
        ("reduce", 0, 0, (), (), (), False),  # commits shuffle rows 0-1: input rows 0-3
        ("produce", 0, 4),
        ("restart_mapper", 0, 0),  # no trim yet: the persisted state is still (0, 0)
    ]
    trace = replay(CONFIG, steps).trace
    # The new instance starts from input row 0 (the persisted state) but at shuffle index
    # 2, above what the reducer committed; the 4 effects of input rows 0-3 (1, 2, 0 and 1
    # mapped rows) are applied a second time, and nothing else is.
    assert "m0@m0-0003 start: ingestion starts at (0, 2)" in trace
    assert "effects applied more than once: 4" in trace
