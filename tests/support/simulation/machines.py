"""The hypothesis state machines that drive the simulated processor: rules are protocol
steps and faults, invariants run after every step (``tests/simulation`` runs them).

Profiles: ``MILLSTREAM_SIM_PROFILE=ci`` (default; a fixed, derandomized budget of a few
minutes on 2 cores) and ``long`` (random, many more and longer runs). A failure prints the
steps hypothesis ran, a ``@reproduce_failure`` blob, and a ``replay(...)`` call that re-runs
the same steps outside hypothesis; replays are deterministic.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from tests.support.simulation import COMMIT_FAULTS, NET_FAULTS, SimConfig, Simulation

settings.register_profile(
    "ci",
    max_examples=1200,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=3000,
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
    st.tuples(st.just("spill"), mapper_index, instance),
    st.tuples(st.just("reduce"), reducer_index, instance),
    st.tuples(st.just("restart_mapper"), mapper_index, instance),
    st.tuples(st.just("crash_mapper"), mapper_index, instance),
    st.tuples(st.just("commit_fault"), st.sampled_from(COMMIT_FAULTS)),
    st.tuples(st.just("deliver_late")),
    st.tuples(st.just("heartbeat"), mapper_index, instance),
    st.tuples(st.just("produce"), mapper_index, st.integers(1, 6)),
)
nested = st.lists(nested_action, max_size=3).map(tuple)


class ProtocolMachine(RuleBasedStateMachine):
    """Rules are protocol steps and faults; invariants run after every step."""

    sim: Simulation
    DELIVERY = "exactly_once"

    def __init__(self) -> None:
        super().__init__()
        self.ok = True

    @initialize(
        totals=st.lists(st.integers(4, 24), min_size=MAPPERS, max_size=MAPPERS).map(tuple),
        batch_rows=st.integers(1, 6),
        commit_max_rows=st.integers(1, 8),
        preaggregate=st.booleans(),
        acknowledge_commits=st.booleans(),
        emit=st.booleans(),
        queue=st.booleans(),
        pipeline_fetch=st.booleans(),
    )
    def setup(
        self,
        totals: tuple[int, ...],
        batch_rows: int,
        commit_max_rows: int,
        preaggregate: bool,
        acknowledge_commits: bool,
        emit: bool,
        queue: bool,
        pipeline_fetch: bool,
    ) -> None:
        self.sim = Simulation(
            SimConfig(
                totals,
                REDUCERS,
                batch_rows,
                commit_max_rows,
                preaggregate=preaggregate,
                acknowledge_commits=acknowledge_commits,
                delivery=self.DELIVERY,
                emit=emit,
                queue=queue and self.DELIVERY == "exactly_once",
                pipeline_fetch=pipeline_fetch,
            )
        )

    def _step(self, *action: Any) -> None:
        self.ok = False
        self.sim.step(action)
        self.ok = True

    # -- protocol steps -----------------------------------------------------------------

    @rule(m=mapper_index, k=instance)
    def ingest(self, m: int, k: int) -> None:
        self._step("ingest", m, k)

    @rule(m=mapper_index, k=instance)
    def trim_input_rows(self, m: int, k: int) -> None:
        self._step("trim", m, k)

    @rule(m=mapper_index, k=instance)
    def spill(self, m: int, k: int) -> None:
        self._step("spill", m, k)

    @rule(
        r=reducer_index,
        k=instance,
        faults=st.lists(st.sampled_from(NET_FAULTS), max_size=MAPPERS).map(tuple),
        before=nested,
        after=nested,
        reverse=st.booleans(),
    )
    def reduce(
        self,
        r: int,
        k: int,
        faults: tuple[str, ...],
        before: tuple[tuple[Any, ...], ...],
        after: tuple[tuple[Any, ...], ...],
        reverse: bool,
    ) -> None:
        self._step("reduce", r, k, faults, before, after, reverse)

    @rule()
    def deliver_late_request(self) -> None:
        self._step("deliver_late")

    @rule(m=mapper_index, n=st.integers(1, 6))
    def produce_input(self, m: int, n: int) -> None:
        self._step("produce", m, n)

    # -- crashes and split brain --------------------------------------------------------

    @rule(m=mapper_index, k=instance)
    def restart_mapper(self, m: int, k: int) -> None:
        self._step("restart_mapper", m, k)

    @rule(m=mapper_index, k=instance)
    def crash_mapper(self, m: int, k: int) -> None:
        self._step("crash_mapper", m, k)

    @rule(m=mapper_index)
    def duplicate_mapper(self, m: int) -> None:
        self._step("duplicate_mapper", m)

    @rule(m=mapper_index, k=instance)
    def mapper_heartbeat(self, m: int, k: int) -> None:
        self._step("heartbeat", m, k)

    @rule(r=reducer_index, duplicate=st.booleans())
    def restart_reducer(self, r: int, duplicate: bool) -> None:
        self._step("restart_reducer", r, duplicate)

    @rule(
        m=mapper_index,
        a_lead=st.booleans(),
        grow=st.integers(1, 8),
        stall=st.sampled_from([None, 0, 1, 2]),
        a_ingests=st.integers(1, 3),
    )
    def split_brain_race(
        self, m: int, a_lead: bool, grow: int, stall: int | None, a_ingests: int
    ) -> None:
        self._step("split_brain_race", m, a_lead, grow, stall, a_ingests)

    @rule(m=mapper_index, grow=st.integers(0, 8), ingests=st.integers(1, 3))
    def restart_mid_stream(self, m: int, grow: int, ingests: int) -> None:
        self._step("restart_mid_stream", m, grow, ingests)

    # -- a producer appending to a store queue ------------------------------------------

    @rule(
        p=st.integers(0, 1),
        rows=st.integers(1, 4),
        faults=st.lists(st.sampled_from(COMMIT_FAULTS), max_size=2).map(tuple),
        restart=st.booleans(),
    )
    def append_input(self, p: int, rows: int, faults: tuple[str, ...], restart: bool) -> None:
        self._step("append", p, rows, faults, restart)

    @rule(m=mapper_index, grow=st.integers(1, 8), a_ingests=st.integers(1, 3))
    def trimmed_read_race(self, m: int, grow: int, a_ingests: int) -> None:
        self._step("trimmed_read_race", m, grow, a_ingests)

    @rule(r=reducer_index, ingests=st.integers(1, 3))
    def reducer_race(self, r: int, ingests: int) -> None:
        self._step("reducer_race", r, ingests)

    @rule(m=mapper_index, shift=st.integers(1, MAPPERS - 1), r=reducer_index)
    def address_reuse(self, m: int, shift: int, r: int) -> None:
        self._step("address_reuse", m, shift, r)

    @rule(m=mapper_index, k=instance, r=reducer_index, ahead=st.integers(1, 6))
    def forge_get_rows(self, m: int, k: int, r: int, ahead: int) -> None:
        self._step("forge", m, k, r, ahead)

    @rule(periods=st.sampled_from([1, 4, 12]))
    def time_passes(self, periods: int) -> None:
        self._step("time_passes", periods)

    # -- faults ---------------------------------------------------------------------

    @rule(kind=st.sampled_from(COMMIT_FAULTS), n=st.integers(1, 3))
    def arm_commit_faults(self, kind: str, n: int) -> None:
        self._step("commit_fault", kind, n)

    @rule(after_calls=st.integers(0, 4), actions=nested)
    def store_latency(self, after_calls: int, actions: tuple[tuple[Any, ...], ...]) -> None:
        self._step("store_latency", after_calls, actions)

    @rule(down=st.booleans())
    def store_availability(self, down: bool) -> None:
        self._step("store_down", down)

    @rule(m=mapper_index, down=st.booleans())
    def partition_availability(self, m: int, down: bool) -> None:
        self._step("partition_down", m, down)

    @rule(m=mapper_index, down=st.booleans())
    def mapper_reachability(self, m: int, down: bool) -> None:
        self._step("mapper_unreachable", m, down)

    # -- checks -------------------------------------------------------------------------

    @invariant()
    def safety(self) -> None:
        if hasattr(self, "sim"):
            self.ok = False
            self.sim.check()
            self.ok = True

    def drained(self, sim: Simulation) -> None:
        """Called after a run drained, before its simulation is closed."""

    def teardown(self) -> None:
        if not hasattr(self, "sim"):
            return
        try:
            note(f"Replay outside hypothesis:\n{self.sim.replay_source()}")
            if self.ok:
                self.sim.drain()
                self.drained(self.sim)
            for name in sorted(self.sim.events):
                event(name)
            for name in sorted(self.sim.plan.injected):
                event(f"injected {name}")
        finally:
            self.sim.close()


class AtLeastOnceMachine(ProtocolMachine):
    """The same steps and faults with ``delivery="at_least_once"``: nothing may be lost
    (every row's effect committed before its mapper's state or input trim passes it, and
    everything once drained), while effects may repeat."""

    DELIVERY = "at_least_once"


class RescaleMachine(ProtocolMachine):
    """The same steps and faults, and the processor's shape changing mid-stream: reducers
    rescaled to another count (:mod:`millstream.ledger.rescale`: the old reducers commit up
    to the cut, one transaction hands over, rows after the cut go to their new owners) and
    partitions moved to other mapper workers, with the same invariants throughout."""

    @rule(num_reducers=st.integers(1, 3))
    def rescale(self, num_reducers: int) -> None:
        self._step("rescale", num_reducers)

    @rule(num_mappers=st.integers(1, MAPPERS))
    def reassign_partitions(self, num_mappers: int) -> None:
        self._step("reassign_partitions", num_mappers)
