"""An input partition that stops sending rows: with ``Panes(idle_timeout=...)`` the panes
still close on the other partition's time, and a row the silent partition sends later for
a closed pane is late (counted in the store, ``millstream status``, the Prometheus
metrics and the late output), not lost."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pytest
from millstream.cli import collect_status
from millstream.outputs import ParquetSink
from millstream.runner.local import LocalRunner

from tests.support.jobs import EVENT_PANES, panes_of, panes_with_late, tuning, written_panes
from tests.support.metrics import scrape, total

MINUTE = 60_000


def _until(done: Callable[[], bool], what: str, step: Callable[[], None] = lambda: None) -> None:
    """Call ``step`` until ``done`` (two minutes at most: a stuck run fails, naming
    ``what``)."""
    deadline = time.monotonic() + 120
    while not done():
        assert time.monotonic() < deadline, f"{what} within two minutes"
        step()
        time.sleep(0.2)


def _idle_job(
    tmp_path: Path, reducer: type[ms.Reducer], name: str
) -> tuple[ms.inputs.StoreQueue, ParquetSink, ParquetSink, ms.Processor]:
    """Panes per minute over a two-partition store queue, idle timeout 1 s, late rows to
    the ``late`` sink: the queue, the pane and late sinks, and the processor."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    queue = ms.inputs.StoreQueue(url, "events", 2, prefix=("input",))
    sink = ParquetSink(url, "per-minute", str(tmp_path / "out"))
    late = ParquetSink(url, "late", str(tmp_path / "late"))
    processor = ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=reducer,
        input=queue,
        store=url,
        num_reducers=2,
        name=name,
        config={"panes": dataclasses.replace(EVENT_PANES, late_output="late", idle_timeout=1.0)},
        outputs=[sink, late],
        tuning=tuning(batch_rows=2_000),
    )
    return queue, sink, late, processor


@pytest.mark.parametrize(
    "reducer",
    [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer],
    ids=["stored", "pending"],
)
def test_panes_close_while_a_partition_is_silent(tmp_path: Path, reducer: type[ms.Reducer]) -> None:
    queue, sink, late, processor = _idle_job(tmp_path, reducer, "idle")
    appended: list[pa.Table] = []
    clock = [0]  # partition 0's event time, ms

    def append(partition: int, ts: np.ndarray) -> None:
        table = pa.table({"ts": ts, "key": ts % 7, "value": ts % 1_000})
        queue.append(partition, table)
        appended.append(table)

    def ten_more_seconds() -> None:
        append(0, clock[0] + np.arange(500, dtype=np.int64) * 20)
        clock[0] += 10_000

    def emitted_through(start: int) -> bool:
        table = sink.read()  # no column before the first file
        return table.num_rows > 0 and start in set(table["window_start"].to_pylist())

    def status_late_rows() -> int:
        status = collect_status(processor.store, "idle", heartbeat=0.2)
        assert status is not None
        return sum(r["late_rows"] or 0 for r in status["reducers"])

    append(1, np.array([1_000, 2_000, 3_000], dtype=np.int64))  # then nothing until the end
    runner = LocalRunner(processor, metrics_port=0)
    runner.start()
    try:
        _until(
            lambda: emitted_through(3 * MINUTE),
            "partition 0's panes close while partition 1 is silent",
            ten_more_seconds,
        )
        append(1, np.array([5_000], dtype=np.int64))  # for pane 0, emitted
        _until(lambda: ms.event_time.late_rows(processor) >= 1, "the late row is counted")
        _until(
            lambda: status_late_rows() == ms.event_time.late_rows(processor),
            "millstream status shows the late rows",
        )
        assert runner.metrics is not None
        port = runner.metrics.port
        _until(
            lambda: (
                total(scrape(port), "millstream_late_rows") == ms.event_time.late_rows(processor)
            ),
            "the metrics show the late rows",
        )
        for p in range(2):
            queue.close_partition(p)
        runner.wait(timeout=120)
    finally:
        runner.stop()
    assert panes_with_late(sink, late) == panes_of(pa.concat_tables(appended))
    counted = ms.event_time.late_rows(processor)
    assert counted == sum(late.read()["n"].to_pylist()) >= 1
    queue.close()


@pytest.mark.parametrize(
    "reducer",
    [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer],
    ids=["stored", "pending"],
)
def test_panes_close_when_every_partition_falls_silent(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    """Partition 0 stops at 150 s of event time, partition 1 at 330 s, and then no row
    comes at all: once the timeout runs out with no new row, the watermark stops being
    held by partition 0, and the panes it passes close on the clock alone. A row partition
    0 sends afterwards for a closed pane is late, not lost."""
    # each partition's rows come in one batch (batch_rows 2,000)
    queue, sink, late, processor = _idle_job(tmp_path, reducer, "silent")

    def rows(ts: np.ndarray) -> pa.Table:
        return pa.table({"ts": ts, "key": ts % 7, "value": ts % 1_000})

    appended = [rows(np.arange(0, 150_000, 100)), rows(np.arange(0, 330_000, 200))]
    for partition, table in enumerate(appended):
        queue.append(partition, table)
    everything = pa.concat_tables(appended)
    # Every partition is silent: the watermark is partition 1's latest time, 329.8 s.
    closing = everything.filter(pa.compute.less(everything["ts"], 5 * MINUTE))
    runner = LocalRunner(processor)
    runner.start()
    try:
        expected = panes_of(closing)
        _until(
            lambda: sink.read().num_rows >= len(expected),
            "the panes the silent partitions' latest times pass close",
        )
        assert written_panes(sink) == expected
        late_row = rows(np.array([10_000], dtype=np.int64))
        queue.append(0, late_row)
        appended.append(late_row)
        _until(lambda: ms.event_time.late_rows(processor) == 1, "the late row is counted")
        for p in range(2):
            queue.close_partition(p)
        runner.wait(timeout=120)
    finally:
        runner.stop()
    assert late.read().to_pylist() == [
        {"window_start": 0, "window_end": MINUTE, "key": 4, "n": 1, "total": 0, "high": 0}
    ]
    assert panes_with_late(sink, late) == panes_of(pa.concat_tables(appended))
    queue.close()
