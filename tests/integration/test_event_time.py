"""Event-time panes end to end: tumbling one-minute panes over a stream with
out-of-order timestamps equal the panes pyarrow computes alone, under kill -9."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pytest
from millstream.outputs import ParquetSink
from millstream.runner.local import LocalRunner

from tests.support.chaos import RandomKiller
from tests.support.jobs import (
    EVENT_DISORDER_MS,
    EVENT_PANES,
    SlowPaneMapper,
    expected_panes,
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
    runner = LocalRunner(processor)
    runner.start()
    with RandomKiller(runner, seed) as killer:
        runner.wait(timeout=300)
    assert killer.kills, "the killer never found a live process"
    assert ms.event_time.late_rows(processor) == 0
    assert written_panes(sink) == expected_panes(data)
    print(f"seed {seed}: killed {killer.kills}; {len(sink.recorded())} files")
