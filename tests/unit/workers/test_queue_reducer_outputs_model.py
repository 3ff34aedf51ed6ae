"""Queue-reducer rounds emitting random combinations of outputs (store writes, queue
appends, Parquet files, nothing), with restarts and failed or ambiguous commits between
rounds, checked against a model: every output of a round that committed lands exactly
once, and nothing of a round that did not (issue 42, items 4 and 5).

The model says, from the round's plan and the fault injected at its commit alone, whether
the round commits: a round that finished rows or emitted any output must commit unless
its commit fails. A file whose commit is known to have landed must be in the sink's
directory (as a plain reader sees it) by the end of the next round, or of the next
restart when the instance that staged it is gone before it landed.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections import Counter
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from millstream.exceptions import (
    CommitUnknownResultError,
    RetryableStoreError,
    StoreUnavailableError,
)
from millstream.state import encode_int64

from tests.support.output_rounds import KINDS, PlannedOutputs, Rig
from tests.support.worker_fixtures import tables

FAULTS = (None, None, "conflict", "unavailable", "unknown", "unknown_unapplied", "unknown_late")
"""Faults of a round's commit (none, twice as likely as each fault)."""

NOT_APPLIED = ("conflict", "unavailable", "unknown_unapplied")
"""Faults after which the round's commit did not land."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One round: a restart of the reducer before it, what ``process`` emits, whether it
    finishes the pending rows, and the fault of its commit."""

    restart: bool
    kinds: frozenset[str]
    finish: bool
    fault: str | None


STEPS = st.lists(
    st.builds(
        Step,
        restart=st.sampled_from([False, False, False, True]),
        kinds=st.frozensets(st.sampled_from(KINDS)),
        finish=st.booleans(),
        fault=st.sampled_from(FAULTS),
    ),
    min_size=1,
    max_size=10,
)


@dataclasses.dataclass
class Model:
    """What must have landed: per token, landed (True/False) or still unknown (None)."""

    landed: dict[str, bool | None] = dataclasses.field(default_factory=dict)
    kinds: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    due: dict[str, int] = dataclasses.field(default_factory=dict)
    """Landed files: the round by whose end they must be published."""
    orphans: set[str] = dataclasses.field(default_factory=set)
    """Landed files whose instance was gone before it knew: due at the next restart."""
    in_flight: str | None = None
    instance: int = 0
    staged_by: dict[str, int] = dataclasses.field(default_factory=dict)
    rows: int = 0


def _round(r: Rig, model: Model, step: Step, at: int) -> None:
    before = Counter(r.plan.injected)  # any commit lands one in flight, the sink's reads too
    if step.restart:
        r.restart()
        r.reducer.start_up()
        model.instance += 1
        for token in model.orphans:
            model.due[token] = at
        model.orphans.clear()
    r.ingest()
    PlannedOutputs.plan = (step.kinds, step.finish)
    emitted = len(PlannedOutputs.emitted)
    if step.fault is not None:
        r.plan.armed.append(step.fault)
    error: BaseException | None = None
    try:
        committed = r.reducer.run_once()
    except (RetryableStoreError, StoreUnavailableError) as exc:
        committed, error = False, exc
    r.plan.armed.clear()
    r.trim()
    late = Counter(r.plan.injected) - before
    if model.in_flight is not None and (late["late_landed"] or late["late_aborted"]):
        token, model.in_flight = model.in_flight, None
        model.landed[token] = bool(late["late_landed"])
        if late["late_landed"]:
            _landed_file(model, token, at)
    new = PlannedOutputs.emitted[emitted:]
    assert len(new) <= 1
    if not new:
        assert not committed
        return
    [(token, kinds, finished)] = new
    model.kinds[token], model.staged_by[token] = kinds, model.instance
    if not kinds and not finished:
        assert not committed, "nothing to commit"
        assert error is None
        model.landed[token] = False
        return
    if step.fault == "unknown_late":
        assert isinstance(error, CommitUnknownResultError)
        model.landed[token] = None
        model.in_flight = token
        return
    if step.fault in NOT_APPLIED:
        assert not committed
        model.landed[token] = False
        return
    unknown = step.fault == "unknown"
    if late["late_landed"]:
        # A commit in flight landed just before this one: it may have changed what this
        # round read (then this one fails as a conflict), or not.
        landed = committed or isinstance(error, CommitUnknownResultError)
    else:
        assert committed != unknown, f"a round that emitted {set(kinds)} must commit"
        assert isinstance(error, CommitUnknownResultError) == unknown, error
        landed = True
    model.landed[token] = landed
    if landed:
        _landed_file(model, token, at)


def _landed_file(model: Model, token: str, at: int) -> None:
    if "parquet" not in model.kinds[token]:
        return
    if model.staged_by[token] == model.instance:
        model.due[token] = at + 1
    else:
        model.orphans.add(token)


def _check_files(r: Rig, model: Model, at: int | None) -> None:
    published = Counter(r.published())
    for token, landed in model.landed.items():
        if "parquet" not in model.kinds[token]:
            continue
        if landed is not True:
            assert not published[token], f"a file of a commit that did not land: {token}"
        elif at is None or model.due.get(token, at + 1) <= at:
            assert published[token] == 1, f"round {at}: {token} published {published[token]}x"
        else:
            assert published[token] <= 1


def _check_end(r: Rig, model: Model) -> None:
    assert model.in_flight is None
    _check_files(r, model, None)
    stored = r.stored("emitted")
    queued = Counter(r.queued())
    for token, landed in model.landed.items():
        kinds = model.kinds[token]
        assert (token in stored) == bool(landed and "store" in kinds), token
        assert queued[token] == (1 if landed and "queue" in kinds else 0), token
    total = sum(t.num_rows for t in r.cluster.tables)
    assert r.stored("rows") == {0: encode_int64(total)}, "every row finished once"


@settings(
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_every_output_of_a_committed_round_lands_exactly_once(
    steps: list[Step], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="millstream")
    with tempfile.TemporaryDirectory() as tmp:
        PlannedOutputs.emitted = []
        r = Rig(Path(tmp), tables(2), PlannedOutputs)
        model = Model()
        try:
            for at, step in enumerate(steps):
                _round(r, model, step, at)
                _check_files(r, model, at)
            if model.in_flight is not None:  # the next commit of any transaction lands it
                landed = r.plan.injected["late_landed"]
                r.plan.land()
                model.landed[model.in_flight] = r.plan.injected["late_landed"] > landed
                model.in_flight = None
            PlannedOutputs.plan = (frozenset(), False)
            r.run_to_end()
            for token in PlannedOutputs.emitted:
                model.landed.setdefault(token[0], True)
                model.kinds.setdefault(token[0], token[1])
            assert r.reducer.finish()
            _check_end(r, model)
        finally:
            r.close()
