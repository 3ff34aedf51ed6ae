"""The simulation can fail: deliberately broken workers (mutants) must be caught.

Each test monkeypatches one protocol step of the real workers with a known-wrong variant
(``tests.support.simulation.mutants``) and asserts that hypothesis finds a sequence of
steps that breaks an invariant.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.simulation.machines import (
    PROFILE,
    AtLeastOnceMachine,
    ProtocolMachine,
    RescaleMachine,
)
from tests.support.simulation.mutants import AT_LEAST_ONCE_MUTANTS, MUTANTS, RESCALE_MUTANTS

MUTANT_SETTINGS = settings(
    max_examples=1000 if PROFILE == "ci" else 4000,
    stateful_step_count=40,
    deadline=None,
    derandomize=PROFILE == "ci",
    database=None,
    print_blob=True,
    # Finding the bug is the point here; shrinking it is only worth the time on demand.
    phases=(
        (Phase.generate, Phase.shrink)
        if os.environ.get("MILLSTREAM_SIM_SHRINK_MUTANTS")
        else (Phase.generate,)
    ),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize(
    ("mutant", "machine"),
    [(name, ProtocolMachine) for name in sorted(MUTANTS)]
    + [(name, AtLeastOnceMachine) for name in sorted(AT_LEAST_ONCE_MUTANTS)]
    + [(name, RescaleMachine) for name in sorted(RESCALE_MUTANTS)],
)
def test_simulation_catches_mutant(
    mutant: str, machine: type[ProtocolMachine], monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, name, replacement = {**MUTANTS, **AT_LEAST_ONCE_MUTANTS, **RESCALE_MUTANTS}[mutant]
    monkeypatch.setattr(cls, name, replacement)
    # Shrinking may tell several distinct failures apart: they come as an ExceptionGroup.
    with pytest.raises((AssertionError, ExceptionGroup)) as caught:
        run_state_machine_as_test(machine, settings=MUTANT_SETTINGS)
    failures = (
        list(caught.value.exceptions)
        if isinstance(caught.value, ExceptionGroup)
        else [caught.value]
    )
    for failure in failures:
        assert isinstance(failure, AssertionError), failure
        notes = "\n".join(getattr(failure, "__notes__", []))
        print(f"mutant {mutant} caught: {failure}\n{notes}")
        assert "replay(SimConfig(" in notes
