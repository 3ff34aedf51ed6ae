"""Property-based fault tests: hypothesis drives the simulated processor
(``tests.support.simulation``) through the state machines of its ``machines`` module.

Profiles: ``MILLSTREAM_SIM_PROFILE=ci`` (default; a fixed, derandomized budget of a few
minutes on 2 cores) and ``long`` (random, many more and longer runs). A failure prints the
steps hypothesis ran, a ``@reproduce_failure`` blob, and a ``replay(...)`` call that re-runs
the same steps outside hypothesis; replays are deterministic.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from tests.support.simulation.machines import (
    PROFILE,
    SETTINGS,
    AtLeastOnceMachine,
    ProtocolMachine,
    RescaleMachine,
)

ProtocolMachine.TestCase.settings = SETTINGS
TestProtocol = ProtocolMachine.TestCase

AtLeastOnceMachine.TestCase.settings = settings(
    SETTINGS, max_examples=SETTINGS.max_examples // 4 if PROFILE == "ci" else SETTINGS.max_examples
)
TestAtLeastOnce = AtLeastOnceMachine.TestCase


def test_profile_is_known() -> None:
    assert PROFILE in ("ci", "long"), f"MILLSTREAM_SIM_PROFILE must be ci or long: {PROFILE}"


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("CRITICAL", logger="millstream")


RescaleMachine.TestCase.settings = settings(
    SETTINGS, max_examples=SETTINGS.max_examples // 6 if PROFILE == "ci" else SETTINGS.max_examples
)
TestRescale = RescaleMachine.TestCase
