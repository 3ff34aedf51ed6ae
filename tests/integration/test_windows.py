"""Event-time windows end to end: tumbling one-minute windows over a stream with
out-of-order timestamps equal the windows pyarrow computes alone, under kill -9."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import pytest
from chaos import RandomKiller
from jobs import SlowWindowMapper, input_table, tuning, write_event_input
from millstream.outputs import ParquetSink
from millstream.runner.local import LocalRunner

MINUTE = 60_000
DISORDER = 5_000

WINDOWS = ms.windows.Windows(
    time="ts",
    key="key",
    size=MINUTE,
    lateness=DISORDER,
    aggregates={"n": (None, "count"), "total": ("value", "sum"), "high": ("value", "max")},
    output="per-minute",
)


def _expected(data: Path) -> list[tuple[int, int, int, int, int]]:
    rows = input_table(data)
    starts = ms.windows.START
    table = rows.append_column(starts, pa_floor(rows["ts"]))
    grouped = table.group_by([starts, "key"]).aggregate(
        [([], "count_all"), ("value", "sum"), ("value", "max")]
    )
    return sorted(
        zip(
            grouped[starts].to_pylist(),
            grouped["key"].to_pylist(),
            grouped["count_all"].to_pylist(),
            grouped["value_sum"].to_pylist(),
            grouped["value_max"].to_pylist(),
            strict=True,
        )
    )


def pa_floor(ts: object) -> object:
    import numpy as np
    import pyarrow as pa

    values = np.asarray(ts.to_numpy())  # type: ignore[attr-defined]
    return pa.array((values // MINUTE) * MINUTE)


def _got(sink: ParquetSink) -> list[tuple[int, int, int, int, int]]:
    table = sink.read()
    return sorted(
        zip(
            table[ms.windows.START].to_pylist(),
            table["key"].to_pylist(),
            table["n"].to_pylist(),
            table["total"].to_pylist(),
            table["high"].to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize(
    ("reducer", "seed"),
    [
        (ms.windows.WindowReducer, 1),
        (ms.windows.WindowReducer, 2),
        (ms.windows.PendingWindowReducer, 1),
        (ms.windows.PendingWindowReducer, 2),
    ],
    ids=["stored-1", "stored-2", "pending-1", "pending-2"],
)
def test_tumbling_windows_are_exact_under_kill_9(
    tmp_path: Path, reducer: type[ms.Reducer], seed: int
) -> None:
    data = write_event_input(tmp_path / "in", 200_000, disorder_ms=DISORDER)
    state = tmp_path / "state.db"
    sink = ParquetSink(f"sqlite:///{state}", "per-minute", str(tmp_path / "out"))
    processor = ms.Processor(
        mapper=SlowWindowMapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=f"sqlite:///{state}",
        num_reducers=2,
        config={"windows": WINDOWS, "map_seconds": 0.04},
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
    assert ms.windows.late_rows(processor) == 0
    assert _got(sink) == _expected(data)
    print(f"seed {seed}: killed {killer.kills}; {len(sink.recorded())} files")
