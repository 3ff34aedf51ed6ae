"""Straggler spill: replays of races the property-based machine found, kept as regressions.

Every step of ``test_protocol_machines.py`` may spill (with every reducer counted as a
straggler); these replays reach one race each on purpose.
"""

from __future__ import annotations

from tests.support.simulation import SimConfig, replay


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
        totals=(4, 4),
        num_reducers=2,
        batch_rows=1,
        commit_max_rows=4,
        acknowledge_commits=False,
        pipeline_fetch=False,  # the race needs the answers asked for after the commit
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
        totals=(4, 4),
        num_reducers=2,
        batch_rows=1,
        commit_max_rows=1,
        acknowledge_commits=False,
        pipeline_fetch=False,  # the race needs the answers asked for after the commit
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


# Queue reducers keep rows pending across commits, so spilled chunks may hold rows they
# hold in memory. Two runs the machine found (CI, derandomized):

QUEUE_CONFIG = SimConfig(
    totals=(18, 23),
    num_reducers=2,
    batch_rows=2,
    commit_max_rows=4,
    preaggregate=False,
    acknowledge_commits=True,
    memory_limit_bytes=4096,
    delivery="exactly_once",
    emit=True,
    queue=True,
)


def test_a_queue_reducer_with_spilled_pending_rows_still_sees_its_mappers_end() -> None:
    # Chunks of rows the reducer held pending kept it from counting a mapper whose input
    # ended: it never finished its last rows (the effects of mapper 1's rows 18-22 were
    # never applied).
    trace = replay(
        QUEUE_CONFIG,
        [
            ("spill", 0, 0),
            ("partition_down", 0, True),
            ("partition_down", 0, True),
            ("split_brain_race", 1, True, 1, None, 2),
            ("partition_down", 0, True),
            ("store_down", False),
            ("partition_down", 0, False),
            ("partition_down", 0, True),
            ("store_down", True),
            ("store_down", False),
            ("restart_mid_stream", 0, 7, 1),
            ("time_passes", 1),
            ("time_passes", 12),
            ("spill", 1, 1),
            ("store_down", True),
            ("store_down", True),
            ("spill", 1, 1),
            ("store_down", True),
            ("time_passes", 4),
            ("split_brain_race", 1, False, 7, 2, 3),
            ("restart_mid_stream", 0, 6, 2),
            ("store_down", True),
            ("split_brain_race", 0, False, 1, 0, 1),
            ("time_passes", 4),
            ("store_down", False),
            ("time_passes", 12),
            ("time_passes", 12),
            ("partition_down", 1, False),
            ("partition_down", 0, True),
            ("partition_down", 1, False),
            ("spill", 0, 0),
            ("spill", 1, 1),
            ("restart_mid_stream", 1, 1, 3),
            ("split_brain_race", 1, False, 1, 0, 3),
            ("partition_down", 1, True),
            ("store_down", False),
            ("store_down", False),
            ("store_down", True),
            ("spill", 0, 1),
            ("split_brain_race", 0, True, 1, None, 3),
            ("spill", 1, 1),
            ("time_passes", 1),
            ("partition_down", 1, True),
            ("restart_mid_stream", 1, 1, 1),
            ("store_down", True),
            ("split_brain_race", 0, True, 7, 1, 2),
            ("time_passes", 12),
            ("restart_mid_stream", 1, 4, 3),
            ("spill", 1, 1),
        ],
    ).trace
    assert trace[-1] == "drained"


def test_a_queue_reducer_clears_chunks_of_rows_it_committed() -> None:
    # A chunk spilled after the reducer committed its rows kept it from seeing the
    # processor drained.
    trace = replay(
        QUEUE_CONFIG,
        [
            ("spill", 0, 0),
            ("partition_down", 0, True),
            ("partition_down", 0, True),
            ("reducer_race", 1, 2),
            ("commit_fault", "unavailable", 3),
            ("trimmed_read_race", 1, 2, 3),
            ("partition_down", 0, False),
            ("address_reuse", 1, 1, 0),
            ("spill", 0, 0),
            ("address_reuse", 1, 1, 1),
            ("commit_fault", "unknown", 2),
            ("address_reuse", 0, 1, 0),
            ("trimmed_read_race", 1, 1, 1),
            ("restart_mapper", 0, 1),
            ("address_reuse", 1, 1, 1),
            ("trimmed_read_race", 1, 5, 1),
            ("address_reuse", 1, 1, 1),
            ("reducer_race", 0, 3),
            ("reducer_race", 0, 1),
            ("spill", 1, 1),
            ("spill", 0, 0),
            ("trimmed_read_race", 1, 1, 3),
            ("spill", 0, 0),
            ("reducer_race", 1, 2),
            ("commit_fault", "unknown_late", 1),
            ("commit_fault", "unknown_late", 1),
            ("address_reuse", 0, 1, 1),
            ("address_reuse", 1, 1, 1),
            ("partition_down", 0, False),
            ("commit_fault", "unavailable", 3),
            ("spill", 1, 0),
            ("trimmed_read_race", 0, 2, 2),
            ("reducer_race", 0, 3),
            ("trimmed_read_race", 0, 4, 2),
            ("trimmed_read_race", 1, 3, 2),
            ("restart_mapper", 1, 1),
            ("commit_fault", "unknown", 3),
            ("restart_mapper", 1, 0),
            ("reducer_race", 0, 2),
            ("partition_down", 1, False),
            ("spill", 0, 1),
            ("address_reuse", 0, 1, 0),
            ("spill", 0, 0),
            ("restart_mapper", 1, 0),
            ("reducer_race", 1, 1),
            ("address_reuse", 1, 1, 0),
            ("trimmed_read_race", 0, 7, 2),
            ("reducer_race", 0, 1),
            ("spill", 1, 0),
        ],
    ).trace
    assert trace[-1] == "drained"


def test_a_rescale_waits_for_the_old_reducers_to_commit_their_spilled_rows() -> None:
    # Mapper 1 spills reducer 0's rows and drops them from its window, so it is drained as
    # soon as its state is persisted; reducer 0 has not read the chunk yet. The old
    # shape's run must go on (as a reducer's loop does while a spill waits for it) until
    # the chunk is committed: handing over earlier is refused ("reducer 0 has spilled
    # rows"), and clearing the chunk would lose its rows.
    config = SimConfig(
        totals=(4, 4),
        num_reducers=2,
        batch_rows=2,
        commit_max_rows=1,
        acknowledge_commits=False,
        queue=True,
    )
    steps = [
        ("trimmed_read_race", 1, 1, 1),
        ("duplicate_mapper", 0),
        ("crash_mapper", 1, 0),
        ("duplicate_mapper", 0),
        ("duplicate_mapper", 0),
        ("reduce", 0, 0, (), (("spill", 1, 0),), (), False),
        ("rescale", 1),
    ]
    trace = replay(config, steps).trace
    assert any("rescale to 1 reducers" in line for line in trace)
    assert trace[-1] == "drained"
