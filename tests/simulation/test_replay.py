"""The simulation replays deterministically, and a failure prints what reproduces it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support import simulation
from tests.support.simulation import Action, Outcome, SimConfig, Simulation, replay
from tests.support.simulation.machines import ProtocolMachine
from tests.support.simulation.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]

CONFIG = SimConfig(
    totals=(14, 9), num_reducers=2, batch_rows=3, commit_max_rows=2, preaggregate=True
)
"""A pre-aggregating map, so the numbering depends on where batches are cut."""

STEPS: list[Action] = [
    ("ingest", 0, 0),
    ("ingest", 1, 0),
    ("reduce", 0, 0, ("ok", "duplicate"), (("ingest", 0, 0),), (("trim", 0, 0),), False),
    ("produce", 0, 3),
    ("commit_fault", "unknown", 1),
    ("commit_fault", "too_old", 1),
    ("commit_fault", "conflict", 1),
    ("reduce", 1, 0, ("delay_request", "drop_response"), (), (("heartbeat", 1, 0),), True),
    ("deliver_late",),
    ("duplicate_mapper", 0),
    ("split_brain_race", 0, True, 4, 1, 2),
    ("restart_mid_stream", 1, 3, 2),
    ("store_latency", 1, (("trim", 1, 0), ("reduce", 0, 0))),
    ("reduce", 1, 0, (), (), (), False),
    ("restart_reducer", 0, True),
    ("partition_down", 1, True),
    ("ingest", 1, 0),
    ("partition_down", 1, False),
    ("trim", 0, 1),
    ("crash_mapper", 0, 0),
    ("mapper_unreachable", 1, True),
    ("reduce", 0, 1, (), (), (), False),
    ("mapper_unreachable", 1, False),
    ("store_down", True),
    ("reduce", 1, 0, (), (), (), False),
    ("store_down", False),
    ("restart_mapper", 1, 0),
]


def _digest(outcome: Outcome) -> str:
    h = hashlib.sha256()
    for line in outcome.trace:
        h.update(line.encode() + b"\n")
    for key, value in outcome.store:
        h.update(repr(key).encode() + b"=" + value + b"\n")
    return h.hexdigest()


def test_a_step_list_replays_identically() -> None:
    first = replay(CONFIG, STEPS)
    second = replay(CONFIG, STEPS)
    assert first.trace == second.trace
    assert first.store == second.store
    trace = "\n".join(first.trace)
    # The steps above reach the interesting paths (else the comparison proves little).
    for what in (
        "split brain",
        "store fault: unknown",
        "store fault: too_old",
        "store stalls",
        "crashed on InputError",
        "drained",
    ):
        assert what in trace, f"the replayed steps never reached {what!r}"


def test_a_replay_in_another_process_is_identical() -> None:
    """Same trace and store in a fresh interpreter with another string-hash seed."""
    code = (
        "import json, logging, sys\n"
        "logging.disable(logging.CRITICAL)\n"
        "from tests.simulation import test_replay as t\n"
        "print(json.dumps(t._digest(t.replay(t.CONFIG, t.STEPS))))\n"
    )
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _digest(replay(CONFIG, STEPS))


class RecordingMachine(ProtocolMachine):
    """Keeps each drained example's configuration, steps, trace and final store."""

    runs: ClassVar[list[tuple[SimConfig, list[Action], list[str], list[Any]]]] = []

    def drained(self, sim: Simulation) -> None:
        RecordingMachine.runs.append((sim.config, list(sim.steps), sim.trace, sim.dump_store()))


SEEDED = settings(
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def test_hypothesis_examples_replay_identically() -> None:
    """A fixed hypothesis seed gives the same runs; each one replays from its printed steps."""
    RecordingMachine.runs = []
    run_state_machine_as_test(RecordingMachine, settings=SEEDED)
    first = RecordingMachine.runs
    RecordingMachine.runs = []
    run_state_machine_as_test(RecordingMachine, settings=SEEDED)
    second = RecordingMachine.runs
    assert len(first) >= 2
    assert first == second
    for config, steps, trace, dump in first[-2:]:
        again = replay(config, steps)
        assert again.trace == trace
        assert again.store == dump


def test_a_failure_prints_a_replay_that_fails_the_same_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cls, name, mutant = MUTANTS["mapper_pops_bucket_on_read"]
    monkeypatch.setattr(cls, name, mutant)
    find = settings(
        max_examples=400,
        stateful_step_count=40,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(ProtocolMachine, settings=find)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "@reproduce_failure(" in notes
    assert "state.setup(" in notes
    call = next(line for line in notes.splitlines() if line.startswith("replay(SimConfig("))
    for _ in range(2):
        with pytest.raises(AssertionError) as again:
            eval(call, vars(simulation))  # the line the report printed
        assert str(again.value) == str(caught.value)
