"""Statements of the SQLite backend's multi-step work fail (an I/O error, a full disk, a
lock timeout) while the process goes on, as a reducer that catches
``StoreUnavailableError`` does; the store must keep agreeing with the model of what
committed, and the queue's producer must land every row once (see
:mod:`tests.support.sqlite_faults`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.sqlite_faults import FAULTS, PLAN, random_program, run_program

PERIOD = 15
"""The sweep fails every ``PERIOD``-th step, from each of the first ``PERIOD`` steps."""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_step_fails_in_turn(small_store_units: None, tmp_path: Path, seed: int) -> None:
    """Each run fails one step in ``PERIOD`` (the process going on after each failure);
    the runs together fail every step of the program once, the fault kinds in turn."""
    program = random_program(random.Random(seed), 14)
    steps = run_program(tmp_path / "count.db", program)
    assert steps > 5 * PERIOD
    failed = PLAN.failed_ops
    for first in range(PERIOD):
        kind = sorted(FAULTS)[(first + seed) % len(FAULTS)]
        run_program(tmp_path / f"{first}.db", program, first, kind, every=PERIOD)
    assert PLAN.failed_ops - failed > PERIOD


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(4, 16),
    at=st.integers(0, 120),
    every=st.sampled_from([0, 7, 11, 29]),
    kind=st.sampled_from(sorted(FAULTS)),
)
def test_steps_failing_in_a_random_program(
    small_store_units: None,
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    length: int,
    at: int,
    every: int,
    kind: str,
) -> None:
    program = random_program(random.Random(seed), length)
    path = tmp_path_factory.mktemp("faults") / "store.db"
    run_program(path, program, at, kind, every=every)
