"""Property-based fault tests: hypothesis drives the simulated processor (see harness.py).

Profiles: ``MILLSTREAM_SIM_PROFILE=ci`` (default; a fixed, derandomized budget of a few
minutes on 2 cores) and ``long`` (random, many more and longer runs). A failure prints the
step sequence and a ``@reproduce_failure`` blob; replays are deterministic.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from tests.simulation.harness import COMMIT_FAULTS, NET_FAULTS, Simulation

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=2000,
    stateful_step_count=120,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("MILLSTREAM_SIM_PROFILE", "ci")
SETTINGS = settings.get_profile(PROFILE)

MAPPERS = 3 if PROFILE == "long" else 2
REDUCERS = 3 if PROFILE == "long" else 2

mapper_index = st.integers(0, MAPPERS - 1)
reducer_index = st.integers(0, REDUCERS - 1)
instance = st.integers(0, 1)

nested_action = st.one_of(
    st.tuples(st.just("ingest"), mapper_index, instance),
    st.tuples(st.just("trim"), mapper_index, instance),
    st.tuples(st.just("reduce"), reducer_index, instance),
    st.tuples(st.just("restart_mapper"), mapper_index, instance),
    st.tuples(st.just("crash_mapper"), mapper_index, instance),
    st.tuples(st.just("commit_fault"), st.sampled_from(COMMIT_FAULTS)),
    st.tuples(st.just("deliver_late")),
    st.tuples(st.just("heartbeat"), mapper_index, instance),
)
nested = st.lists(nested_action, max_size=3)


class ProtocolMachine(RuleBasedStateMachine):
    """Rules are protocol steps and faults; invariants run after every step."""

    sim: Simulation

    def __init__(self) -> None:
        super().__init__()
        self.ok = True

    @initialize(
        totals=st.lists(st.integers(4, 24), min_size=MAPPERS, max_size=MAPPERS),
        batch_rows=st.integers(1, 6),
        commit_max_rows=st.integers(1, 8),
    )
    def setup(self, totals: list[int], batch_rows: int, commit_max_rows: int) -> None:
        self.sim = Simulation(
            totals, REDUCERS, batch_rows=batch_rows, commit_max_rows=commit_max_rows
        )

    def _step(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        self.ok = False
        fn(*args, **kwargs)
        self.ok = True

    # -- protocol steps -----------------------------------------------------------------

    @rule(m=mapper_index, k=instance)
    def ingest(self, m: int, k: int) -> None:
        self._step(self.sim.ingest, m, k)

    @rule(m=mapper_index, k=instance)
    def trim_input_rows(self, m: int, k: int) -> None:
        self._step(self.sim.trim, m, k)

    @rule(
        r=reducer_index,
        k=instance,
        faults=st.lists(st.sampled_from(NET_FAULTS), max_size=MAPPERS),
        before=nested,
        after=nested,
        reverse=st.booleans(),
    )
    def reduce(
        self,
        r: int,
        k: int,
        faults: list[str],
        before: list[tuple[Any, ...]],
        after: list[tuple[Any, ...]],
        reverse: bool,
    ) -> None:
        self._step(self.sim.reduce, r, k, faults, before, after, reverse)

    @rule()
    def deliver_late_request(self) -> None:
        self._step(self.sim.net.deliver_late)

    @rule(m=mapper_index, n=st.integers(1, 6))
    def produce_input(self, m: int, n: int) -> None:
        p = self.sim.partitions[m]
        p.visible = min(p.total, p.visible + n)

    # -- crashes and split brain --------------------------------------------------------

    @rule(m=mapper_index, k=instance)
    def restart_mapper(self, m: int, k: int) -> None:
        self._step(self.sim.restart_mapper, m, k)

    @rule(m=mapper_index, k=instance)
    def crash_mapper(self, m: int, k: int) -> None:
        self._step(self.sim.crash_mapper, m, k)

    @rule(m=mapper_index)
    def duplicate_mapper(self, m: int) -> None:
        if len(self.sim.mappers[m]) < 2:
            self._step(self.sim.start_mapper, m)

    @rule(m=mapper_index, k=instance)
    def mapper_heartbeat(self, m: int, k: int) -> None:
        self._step(self.sim.do, ("heartbeat", m, k))

    @rule(r=reducer_index, duplicate=st.booleans())
    def restart_reducer(self, r: int, duplicate: bool) -> None:
        if duplicate and len(self.sim.reducers[r]) >= 2:
            return
        self._step(self.sim.start_reducer, r, duplicate=duplicate)

    # -- faults ---------------------------------------------------------------------

    @rule(kind=st.sampled_from(COMMIT_FAULTS), n=st.integers(1, 3))
    def arm_commit_faults(self, kind: str, n: int) -> None:
        self.sim.plan.armed.extend([kind] * n)

    @rule(down=st.booleans())
    def store_availability(self, down: bool) -> None:
        self.sim.plan.unavailable = down

    @rule(m=mapper_index, down=st.booleans())
    def partition_availability(self, m: int, down: bool) -> None:
        self.sim.partitions[m].unavailable = down

    @rule(m=mapper_index, down=st.booleans())
    def mapper_reachability(self, m: int, down: bool) -> None:
        if down:
            self.sim.net.unreachable.add(m)
        else:
            self.sim.net.unreachable.discard(m)

    # -- checks -------------------------------------------------------------------------

    @invariant()
    def safety(self) -> None:
        if hasattr(self, "sim"):
            self.ok = False
            self.sim.check()
            self.ok = True

    def teardown(self) -> None:
        if not hasattr(self, "sim"):
            return
        try:
            if self.ok:
                self.sim.drain()
        finally:
            self.sim.close()


ProtocolMachine.TestCase.settings = SETTINGS
TestProtocol = ProtocolMachine.TestCase


def test_profile_is_known() -> None:
    assert PROFILE in ("ci", "long"), f"MILLSTREAM_SIM_PROFILE must be ci or long: {PROFILE}"


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("CRITICAL", logger="millstream")
