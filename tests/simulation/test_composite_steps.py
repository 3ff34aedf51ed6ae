"""Each composite step reaches the race it exists for, and the workers survive it.

The steps replay deterministically (see ``tests.support.simulation``); every invariant is
checked after each step and the run drains at the end, through the instances that
survived it.
"""

from __future__ import annotations

import pytest

from tests.support.simulation import SimConfig, replay

CONFIG = SimConfig(
    totals=(20, 12), num_reducers=2, batch_rows=4, commit_max_rows=8, preaggregate=True
)


def _after(trace: list[str], marker: str) -> list[str]:
    """The trace from the first line that contains ``marker`` on."""
    for i, line in enumerate(trace):
        if marker in line:
            return trace[i:]
    raise AssertionError(f"the steps never reached {marker!r}")


@pytest.mark.parametrize("acknowledge", [True, False])
def test_a_duplicate_reading_rows_the_other_trims_restarts(acknowledge: bool) -> None:
    config = SimConfig(
        CONFIG.totals,
        CONFIG.num_reducers,
        CONFIG.batch_rows,
        CONFIG.commit_max_rows,
        preaggregate=True,
        acknowledge_commits=acknowledge,
    )
    outcome = replay(config, [("duplicate_mapper", 0), ("trimmed_read_race", 0, 3, 2)])
    after = _after(outcome.trace, "input stalls: B trims while A reads")
    # B's trim happens inside A's read; A's ingest step then ends in split brain.
    assert any(line.startswith("m0@") and line.endswith("trim: True") for line in after[:4])
    assert any(line.startswith("m0@m0-0001 ingest: split brain") for line in after), after[:8]
    assert "drained" in outcome.trace


def test_a_reducer_racing_its_duplicate_commits_once() -> None:
    outcome = replay(CONFIG, [("reducer_race", 0, 2)])
    after = _after(outcome.trace, "commit waits: r0 instance 1 reduces")
    # The duplicate commits inside the wait; the first instance's commit is refused.
    duplicate, first = [line for line in after if " reduce: " in line and "busy" not in line][:2]
    assert duplicate.startswith("r0@r0-")
    assert " reduce: True" in duplicate
    assert " reduce: False" in first
    assert "drained" in outcome.trace


def test_a_call_reaching_another_mapper_on_a_reused_address_is_refused() -> None:
    steps = [("ingest", 0, 0), ("ingest", 1, 0), ("address_reuse", 0, 1, 0)]
    outcome = replay(CONFIG, steps)
    after = _after(outcome.trace, "step ('address_reuse'")
    assert any("start m1@" in line and ":mapper0" in line for line in after)
    assert any("m0 call refused: StaleMapperError" in line for line in after)
    assert "drained" in outcome.trace


def test_the_drain_runs_the_surviving_duplicates_to_the_end() -> None:
    steps = [
        ("duplicate_mapper", 0),
        ("split_brain_race", 0, True, 4, None, 1),
        ("crash_mapper", 1, 0),
        ("time_passes", 12),
    ]
    outcome = replay(CONFIG, steps)
    trace = outcome.trace
    heal = trace.index("heal")
    # Both instances of mapper 0 survive into the drain; mapper 1 gets a new one.
    assert not any(line.startswith("kill m0@") for line in trace[heal:])
    assert any(line.startswith("start m1@") for line in trace[heal:])
    assert trace[-1] == "drained"


def test_a_forged_get_rows_makes_the_mapper_restart_and_loses_nothing() -> None:
    steps = [
        ("ingest", 0, 0),
        ("ingest", 0, 0),
        ("reduce", 1, 0),
        ("forge", 0, 0, 1, 3),
        ("trim", 0, 0),
        ("ingest", 0, 0),
    ]
    outcome = replay(CONFIG, steps)
    after = _after(outcome.trace, "forged GetRows: m0@")
    # The trim finds reducer 1's claim beyond the store: the mapper restarts from its
    # persisted state (split brain) instead of persisting past rows nobody committed.
    assert any(line.startswith("m0@") and "trim: split brain" in line for line in after)
    assert any("ingestion starts at" in line for line in after)
    assert "drained" in outcome.trace


def test_a_restarted_instance_never_listens_on_a_port_a_live_one_holds() -> None:
    # Found by the protocol simulation: nested restarts started two live instances of
    # mapper 1 on one address, then another mapper took that address while the older of
    # the two still beat with it in discovery; reducers were refused there for ever. A
    # port a live instance holds cannot be bound again, so the newer instance listens on
    # a new host and the run drains.
    config = SimConfig(
        totals=(19, 24),
        num_reducers=2,
        batch_rows=4,
        commit_max_rows=6,
        acknowledge_commits=False,
        emit=True,
        queue=True,
    )
    steps = [
        ("commit_fault", "conflict", 1),
        ("restart_reducer", 0, True),
        ("restart_mapper", 0, 0),
        ("deliver_late",),
        ("restart_mid_stream", 0, 0, 2),
        ("deliver_late",),
        ("restart_mid_stream", 0, 0, 3),
        ("reducer_race", 0, 1),
        ("split_brain_race", 0, True, 6, None, 3),
        ("deliver_late",),
        ("deliver_late",),
        ("deliver_late",),
        ("forge", 0, 0, 0, 1),
        ("commit_fault", "conflict", 1),
        ("deliver_late",),
        ("restart_mid_stream", 0, 0, 2),
        ("deliver_late",),
        ("deliver_late",),
        ("deliver_late",),
        ("store_latency", 0, ()),
        ("deliver_late",),
        ("forge", 0, 0, 0, 5),
        ("split_brain_race", 0, True, 3, None, 1),
        ("address_reuse", 1, 1, 0),
        ("restart_mapper", 0, 0),
        ("deliver_late",),
        ("deliver_late",),
        ("reducer_race", 0, 1),
        ("append", 0, 4, (), True),
        ("deliver_late",),
        ("store_down", False),
        ("deliver_late",),
        ("restart_mid_stream", 1, 8, 1),
        ("split_brain_race", 0, False, 6, 1, 1),
        ("crash_mapper", 1, 0),
        ("restart_mid_stream", 0, 8, 3),
        ("restart_mapper", 0, 0),
        ("reduce", 1, 1, (), (("spill", 0, 0), ("crash_mapper", 0, 0)), (), True),
        ("crash_mapper", 0, 0),
        ("store_latency", 4, (("restart_mapper", 1, 0),)),
        ("mapper_unreachable", 0, True),
        ("heartbeat", 1, 1),
        ("split_brain_race", 1, False, 4, 2, 1),
        ("restart_mid_stream", 1, 3, 3),
        ("address_reuse", 0, 1, 1),
        ("store_down", False),
        ("store_latency", 4, (("restart_mapper", 1, 1), ("spill", 1, 1))),
        ("restart_mid_stream", 1, 2, 3),
        ("address_reuse", 1, 1, 1),
    ]
    outcome = replay(config, steps)
    assert outcome.trace[-1] == "drained"


@pytest.mark.parametrize("preaggregate", [False, True])
def test_rescaling_and_moving_partitions_mid_stream_drain_exactly_once(preaggregate: bool) -> None:
    config = SimConfig(
        totals=(12, 17),
        num_reducers=2,
        batch_rows=3,
        commit_max_rows=4,
        preaggregate=preaggregate,
    )
    steps = [
        ("ingest", 0, 0),
        ("ingest", 1, 0),
        ("reduce", 0, 0),
        ("ingest", 0, 0),
        ("trim", 0, 0),
        ("rescale", 3),
        ("produce", 0, 5),
        ("ingest", 0, 0),
        ("ingest", 1, 0),
        ("reduce", 2, 0),
        ("reduce", 1, 0),
        ("reassign_partitions", 1),
        ("ingest", 1, 0),
        ("reduce", 0, 0),
        ("rescale", 1),
        ("ingest", 0, 0),
        ("reduce", 0, 0),
    ]
    outcome = replay(config, steps)
    assert sum("rescale to" in line for line in outcome.trace) == 2
    assert outcome.trace[-1] == "drained"
