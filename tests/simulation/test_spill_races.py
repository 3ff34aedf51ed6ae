"""Straggler spill: replays of races the property-based machine found, kept as regressions.

Every step of ``test_protocol_simulation.py`` may spill (with every reducer counted as a
straggler); these replays reach one race each on purpose.
"""

from __future__ import annotations

from tests.simulation.harness import SimConfig, replay


def test_rows_spilled_after_their_commit_are_cleared() -> None:
    # Without acknowledgements a restarted mapper learns of reducer 0's commits only from
    # its next GetRows, so it spills rows reducer 0 committed already. Those chunks must
    # not keep the reducer from seeing the processor drained.
    config = SimConfig(
        totals=(4, 16),
        num_reducers=2,
        batch_rows=1,
        commit_max_rows=1,
        acknowledge_commits=False,
    )
    steps = [
        ("trimmed_read_race", 1, 1, 1),
        ("address_reuse", 0, 1, 1),
        ("trimmed_read_race", 1, 1, 1),
        ("restart_mapper", 1, 0),
        ("spill", 1, 1),
    ]
    trace = replay(config, steps).trace
    spilled = [line for line in trace if " spill: " in line]
    assert spilled, "the steps never spilled"
    assert not spilled[-1].endswith("spill: 0"), spilled
    assert trace[-1] == "drained"


def test_a_straggler_commits_its_spilled_rows_once_the_mapper_trimmed_them() -> None:
    config = SimConfig(
        totals=(40, 8),
        num_reducers=2,
        batch_rows=4,
        commit_max_rows=8,
        preaggregate=True,
        memory_limit_bytes=2048,
    )
    steps = [
        ("produce", 0, 20),
        *[("ingest", 0, 0)] * 8,
        *[("reduce", 1, 0, (), (), (), False)] * 3,
        ("spill", 0, 0),
        ("trim", 0, 0),
        ("ingest", 0, 0),
        ("ingest", 0, 0),
    ]
    trace = replay(config, steps).trace
    assert "m0@m0-0001 spill: 8" in trace
    assert trace[trace.index("m0@m0-0001 spill: 8") + 2] == "m0@m0-0001 trim: True"
    assert trace[-1] == "drained"


def test_a_spill_between_the_reducers_view_and_the_answers_is_read() -> None:
    # Reducer 0 commits mapper 0's rows and tells it; while reducer 1 reads its view and
    # waits for answers, the mapper spills reducer 1's row of the oldest entry and answers
    # with the rows after it. Reducer 1 must take the spilled row first.
    config = SimConfig(
        totals=(4, 4), num_reducers=2, batch_rows=1, commit_max_rows=4, acknowledge_commits=False
    )
    steps = [
        ("reducer_race", 0, 3),
        ("time_passes", 1),
        ("reduce", 0, 0, (), (), (), False),
        ("reduce", 1, 0, (), (("ingest", 0, 0), ("spill", 0, 0)), (), False),
    ]
    trace = replay(config, steps).trace
    assert "m0@m0-0001 spill: 1" in trace
    assert "r1@r1-0004 reduce: True ReducerState(committed_row_indices=(1, 2))" in trace
    assert trace[-1] == "drained"


def test_a_mapper_with_a_false_claim_does_not_spill() -> None:
    # A forged GetRows pops reducer 1's first row from mapper 1's window; a spill that
    # followed would hand reducer 1 its later rows straight from the store, past the gap.
    # The spill checks the claims first and the mapper restarts instead.
    config = SimConfig(
        totals=(4, 4), num_reducers=2, batch_rows=1, commit_max_rows=1, acknowledge_commits=False
    )
    steps = [
        ("forge", 1, 0, 1, 1),
        ("restart_mid_stream", 0, 0, 1),
        ("commit_fault", "unknown", 1),
        ("split_brain_race", 1, False, 1, None, 3),
        ("spill", 1, 0),
    ]
    trace = replay(config, steps).trace
    assert "m1@m1-0002 spill: split brain" in trace
    assert trace[-1] == "drained"
