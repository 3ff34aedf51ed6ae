"""Event-time panes and a Parquet sink through Spark: the same exact panes as pyarrow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pytest
from millstream.inputs.store_queue import StoreQueue
from millstream.outputs import ParquetSink
from millstream.spark import run

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

MINUTE = 60_000


def events(rows: int, seed: int) -> pa.Table:
    """Rows 10 ms apart, up to 2 s out of order, 30 keys."""
    rng = np.random.default_rng(seed)
    ts = np.arange(rows, dtype=np.int64) * 10 + rng.integers(0, 2_001, rows)
    return pa.table(
        {
            "ts": ts,
            "key": rng.integers(0, 30, rows, dtype=np.int64),
            "value": rng.integers(-100, 100, rows, dtype=np.int64),
        }
    )


def test_panes_into_a_parquet_sink_are_exact_on_spark(spark: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = StoreQueue(url, "events", 2)
    parts = [events(15_000, seed=p) for p in range(2)]
    for p, part in enumerate(parts):
        queue.append(p, part)
        queue.close_partition(p)
    sink = ParquetSink(url, "per-minute", str(tmp_path / "out"))
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        lateness=2_000,
        aggregates={"n": (None, "count"), "total": ("value", "sum")},
        output="per-minute",
    )
    processor = ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=ms.event_time.PaneReducer,
        input=queue,
        store=url,
        num_reducers=2,
        name="panes",
        config={"panes": panes},
        outputs=[sink],
        tuning=ms.Tuning(batch_rows=2_000, commit_interval_seconds=0.1, heartbeat_seconds=0.2),
    )
    summary = run(spark, processor, timeout=120)
    assert summary.rows_read == 30_000
    rows = pa.concat_tables(parts)
    starts = (np.asarray(rows["ts"]) // MINUTE) * MINUTE
    want = (
        rows.append_column("window_start", pa.array(starts))
        .group_by(["window_start", "key"])
        .aggregate([([], "count_all"), ("value", "sum")])
    )
    got = sink.read()
    assert sorted(
        zip(
            got["window_start"].to_pylist(),
            got["key"].to_pylist(),
            got["n"].to_pylist(),
            got["total"].to_pylist(),
            strict=True,
        )
    ) == sorted(
        zip(
            want["window_start"].to_pylist(),
            want["key"].to_pylist(),
            want["count_all"].to_pylist(),
            want["value_sum"].to_pylist(),
            strict=True,
        )
    )
    assert ms.event_time.late_rows(processor) == 0
