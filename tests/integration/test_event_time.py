"""Event-time panes end to end: tumbling one-minute panes over a stream with
out-of-order timestamps equal the panes pyarrow computes alone, under kill -9; with late
rows injected, every row counts once: in its pane, or late (counted and in the late
output)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import millstream as ms
import pytest
from millstream.outputs import ParquetSink

from tests.support.chaos import run_killed
from tests.support.jobs import (
    EVENT_DISORDER_MS,
    EVENT_PANES,
    SlowPaneMapper,
    expected_panes,
    panes_with_late,
    tuning,
    write_event_input,
    written_panes,
)
from tests.support.stores import ON_FDB


@pytest.mark.parametrize(
    ("reducer", "seed", "state_url"),
    [
        (ms.event_time.PaneReducer, 1, "sqlite"),
        (ms.event_time.PaneReducer, 2, "sqlite"),
        (ms.event_time.PendingPaneReducer, 1, "sqlite"),
        (ms.event_time.PendingPaneReducer, 2, "sqlite"),
        pytest.param(ms.event_time.PaneReducer, 3, *ON_FDB.values, marks=ON_FDB.marks),
    ],
    ids=["stored-1", "stored-2", "pending-1", "pending-2", "stored-3-fdb"],
    indirect=["state_url"],
)
def test_tumbling_panes_are_exact_under_kill_9(
    tmp_path: Path, reducer: type[ms.Reducer], seed: int, state_url: str
) -> None:
    data = write_event_input(tmp_path / "in", 200_000, disorder_ms=EVENT_DISORDER_MS)
    sink = ParquetSink(state_url, "per-minute", str(tmp_path / "out"))
    processor = ms.Processor(
        mapper=SlowPaneMapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=state_url,
        num_reducers=2,
        config={"panes": EVENT_PANES, "map_seconds": 0.04},
        outputs=[sink],
        tuning=tuning(
            batch_rows=2_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    _, kills = run_killed(processor, seed)
    assert ms.event_time.late_rows(processor) == 0
    assert written_panes(sink) == expected_panes(data)
    print(f"seed {seed}: killed {kills}; {len(sink.recorded())} files")


@pytest.mark.parametrize(
    "reducer",
    [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer],
    ids=["stored", "pending"],
)
def test_late_rows_count_once_under_kill_9(tmp_path: Path, reducer: type[ms.Reducer]) -> None:
    """Which rows are late depends on when they arrive; that each row counts once does
    not: the panes emitted (each once) plus the late output equal pyarrow's panes over
    every row, and the late rows counted are the late output's."""
    data = write_event_input(tmp_path / "in", 200_000, disorder_ms=EVENT_DISORDER_MS, late_every=50)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "per-minute", str(tmp_path / "out"))
    late = ParquetSink(url, "late", str(tmp_path / "late"))
    processor = ms.Processor(
        mapper=SlowPaneMapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=url,
        num_reducers=2,
        config={
            "panes": dataclasses.replace(EVENT_PANES, late_output="late"),
            "map_seconds": 0.04,
        },
        outputs=[sink, late],
        tuning=tuning(
            batch_rows=2_000,
            commit_interval_seconds=0.1,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    _, kills = run_killed(processor, 4)
    emitted = written_panes(sink)
    assert len({(start, key) for start, key, *_ in emitted}) == len(emitted)
    assert panes_with_late(sink, late) == expected_panes(data)
    counted = ms.event_time.late_rows(processor)
    late_rows = late.read()  # no files, no columns: nothing came late in this run
    assert counted == (sum(late_rows["n"].to_pylist()) if late_rows.num_rows else 0)
    # Not asserted: that some row came late. A reducer catching up after a kill may fetch
    # a partition's on-time and injected rows in one batch, and rows of one batch join
    # their panes before the watermark the batch carries closes them. Counting itself is
    # checked where it is deterministic (tests/unit/event_time/test_late_rows.py,
    # tests/integration/test_idle_partitions.py).
    print(f"killed {kills}; {counted} late rows")
