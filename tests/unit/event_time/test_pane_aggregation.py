"""Event-time panes in one process: results equal pyarrow's over the same rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from millstream.outputs import ParquetSink
from millstream.testing import MemoryInput, run_in_process

from tests.support.event_time import MINUTE, commit_round, stream

REDUCERS = [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer]
"""Open panes' partials in the store, or pending in the mappers' windows."""


@pytest.fixture(params=REDUCERS, ids=["stored", "pending"])
def reducer(request: pytest.FixtureRequest) -> type[ms.Reducer]:
    return request.param  # type: ignore[no-any-return]


def expected(tables: list[pa.Table], size: int, slide: int) -> pa.Table:
    """Panes, key, count, sum, min, max and mean computed with pyarrow alone."""
    rows = pa.concat_tables(tables)
    parts = []
    for offset in range(0, size, slide):
        ts = rows["ts"].to_numpy()
        starts = (ts // slide) * slide - offset
        inside = (starts <= ts) & (ts < starts + size)
        part = rows.filter(pa.array(inside)).append_column("window_start", pa.array(starts[inside]))
        parts.append(part)
    grouped = (
        pa.concat_tables(parts)
        .group_by(["window_start", "key"])
        .aggregate(
            [
                ([], "count_all"),
                ("value", "sum"),
                ("value", "min"),
                ("value", "max"),
                ("value", "mean"),
            ]
        )
    )
    return grouped.sort_by([("window_start", "ascending"), ("key", "ascending")])


AGGREGATES = {
    "n": (None, "count"),
    "total": ("value", "sum"),
    "low": ("value", "min"),
    "high": ("value", "max"),
    "avg": ("value", "mean"),
}


def _run(
    tmp_path: Path,
    tables: list[pa.Table],
    panes: ms.event_time.Panes,
    reducer: type[ms.Reducer],
    late: int = 0,
) -> pa.Table:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "out"))
    processor = ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=reducer,
        input=MemoryInput(tables),
        store=url,
        num_reducers=2,
        config={"panes": panes},
        outputs=[sink],
        tuning=ms.Tuning(batch_rows=500),
    )
    run_in_process(processor)
    assert ms.event_time.late_rows(processor) == late
    return sink.read().sort_by([("window_start", "ascending"), ("key", "ascending")])


def _check(got: pa.Table, want: pa.Table, size: int) -> None:
    assert got["window_start"].to_pylist() == want["window_start"].to_pylist()
    assert got["window_end"].to_pylist() == [s + size for s in want["window_start"].to_pylist()]
    assert got["key"].to_pylist() == want["key"].to_pylist()
    assert got["n"].to_pylist() == want["count_all"].to_pylist()
    assert got["total"].to_pylist() == want["value_sum"].to_pylist()
    assert got["low"].to_pylist() == want["value_min"].to_pylist()
    assert got["high"].to_pylist() == want["value_max"].to_pylist()
    assert np.allclose(got["avg"].to_numpy(), want["value_mean"].to_numpy())


def test_tumbling_panes_equal_pyarrows(tmp_path: Path, reducer: type[ms.Reducer]) -> None:
    tables = stream(2, 20_000, disorder=2_000)
    panes = ms.event_time.Panes(
        time="ts", key="key", size=MINUTE, lateness=2_000, aggregates=AGGREGATES, output="panes"
    )
    _check(_run(tmp_path, tables, panes, reducer), expected(tables, MINUTE, MINUTE), MINUTE)


def test_sliding_panes_equal_pyarrows(tmp_path: Path, reducer: type[ms.Reducer]) -> None:
    tables = stream(2, 6_000, disorder=500)
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        slide=MINUTE // 4,
        lateness=500,
        aggregates=AGGREGATES,
        output="panes",
    )
    _check(_run(tmp_path, tables, panes, reducer), expected(tables, MINUTE, MINUTE // 4), MINUTE)


def test_rows_later_than_the_lateness_are_dropped_and_counted(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    tables = stream(1, 20_000, disorder=0)
    late = pa.table(
        {"ts": pa.array([5], pa.int64()), "key": pa.array([1], pa.int64()), "value": [7]}
    )
    tables = [pa.concat_tables([tables[0], late])]
    panes = ms.event_time.Panes(
        time="ts", key="key", size=MINUTE, aggregates=AGGREGATES, output="panes"
    )
    got = _run(tmp_path, tables, panes, reducer, late=1)
    _check(got, expected([tables[0].slice(0, 20_000)], MINUTE, MINUTE), MINUTE)


def test_timestamp_columns_and_timedeltas(tmp_path: Path, reducer: type[ms.Reducer]) -> None:
    tables = [
        t.set_column(0, "ts", pc.cast(t["ts"], pa.timestamp("ms")))
        for t in stream(2, 6_000, disorder=100)
    ]
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=dt.timedelta(minutes=1),
        lateness=dt.timedelta(seconds=1),
        aggregates={"n": (None, "count")},
        output="panes",
    )
    got = _run(tmp_path, tables, panes, reducer)
    assert got.schema.field("window_start").type == pa.timestamp("ms")
    assert pc.sum(got["n"]).as_py() == 12_000


def test_bad_panes_are_refused() -> None:
    with pytest.raises(ms.exceptions.ConfigurationError, match="function must be one of"):
        ms.event_time.Panes(
            time="ts", key="k", size=1, aggregates={"x": ("v", "median")}, output="o"
        )
    with pytest.raises(ms.exceptions.ConfigurationError, match="size must be positive"):
        ms.event_time.Panes(
            time="ts", key="k", size=0, aggregates={"n": (None, "count")}, output="o"
        )


def test_a_commit_that_failed_leaves_the_panes_as_the_store_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reducer: type[ms.Reducer]
) -> None:
    from tests.support.worker_fixtures import ConflictingCommits

    conflicts = ConflictingCommits(every=3)
    conflicts.install(monkeypatch)
    tables = stream(2, 20_000, disorder=2_000)
    panes = ms.event_time.Panes(
        time="ts", key="key", size=MINUTE, lateness=2_000, aggregates=AGGREGATES, output="panes"
    )
    got = _run(tmp_path, tables, panes, reducer)
    assert conflicts.calls > 6
    _check(got, expected(tables, MINUTE, MINUTE), MINUTE)


def test_a_commit_that_landed_unconfirmed_is_read_back_from_the_store(tmp_path: Path) -> None:
    """The commit of the first batch lands but its outcome is unknown (``on_commit`` is
    not called): the reducer must read the panes back before merging the next batch."""
    from millstream.state import open_store

    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "out"))
    tables = stream(1, 3_000, disorder=0)
    panes = ms.event_time.Panes(
        time="ts", key=None, size=MINUTE, aggregates={"n": (None, "count")}, output="panes"
    )
    config = {"panes": panes}
    mapper = ms.event_time.PaneMapper(ms.WorkerSpec("p", "mapper", 0, "m", 1, 1), config)
    reducer = ms.event_time.PaneReducer(ms.WorkerSpec("p", "reducer", 0, "r", 1, 1), config)
    store = open_store(url, prefix=("p",))
    batches = [mapper.map(b).batch for b in tables[0].slice(0, 1_000).to_batches()]
    batches += [mapper.map(b).batch for b in tables[0].slice(1_000).to_batches(max_chunksize=1_000)]

    def commit(call: str, batch: pa.RecordBatch | None = None) -> None:
        if batch is None:
            commit_round(store, sink, reducer.drain)
        else:
            commit_round(store, sink, lambda t: reducer.reduce(batch, t))
        if call == "confirmed":
            reducer.on_commit()

    commit("unknown", batches[0])
    for batch in batches[1:]:
        commit("confirmed", batch)
    commit("confirmed")
    assert pc.sum(sink.read()["n"]).as_py() == 3_000
    store.close()


def _cluster(
    tmp_path: Path, tables: list[pa.Table], reducer: type[ms.Reducer]
) -> tuple[Any, ParquetSink]:
    """Workers stepped in this process: tumbling minutes (100 ms late at most) into a sink."""
    from tests.support.worker_fixtures import Cluster

    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "out"))
    panes = ms.event_time.Panes(
        time="ts", key="key", size=MINUTE, lateness=100, aggregates=AGGREGATES, output="panes"
    )
    cluster = Cluster(
        tmp_path,
        tables,
        mapper=ms.event_time.PaneMapper,
        reducer=reducer,
        config={"panes": panes},
        outputs=[sink],
    )
    return cluster, sink


def test_a_drained_mapper_no_longer_holds_the_watermark(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    """Partition 1 ends after 1,000 rows (10 s); partition 0 goes on for 6 minutes: once
    mapper 1 drained (the pending reducer: once its input ended and the reducer fetched
    its last rows), partition 0's minutes close as its watermark passes them, before the
    processor drains."""
    tables = stream(2, 36_000, disorder=100)
    tables[1] = tables[1].slice(0, 1_000)
    c, sink = _cluster(tmp_path, tables, reducer)
    for _ in range(2_000):
        c.step()
        for mapper in c.mappers.values():
            if mapper.is_drained():
                mapper.mark_drained()
        if c.mappers[1].is_drained() and c.mappers[0].window is not None:
            read = c.mappers[0].window.snapshot().input_end_row_index
            if read >= 30_000:
                break
    else:
        raise AssertionError("mapper 1 never drained")
    assert not c.mappers[0].is_drained()
    closed = sink.read()
    assert closed.num_rows > 0, "minutes of partition 0 closed while mapper 0 still reads"
    starts = set(closed["window_start"].to_pylist())
    assert {0, MINUTE, 2 * MINUTE} <= starts
    c.run_to_end()
    for worker in c.reducers.values():
        assert worker.finish()
    assert ms.event_time.late_rows(c.processor) == 0
    _check(
        sink.read().sort_by([("window_start", "ascending"), ("key", "ascending")]),
        expected(tables, MINUTE, MINUTE),
        MINUTE,
    )
    c.store.close()


def test_a_restarted_pending_reducer_waits_for_the_rows_it_fetches_again(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    """Mapper 1 reads far ahead of mapper 0 (200 s of events against 70 s), so reducers
    hold many of its rows pending when the first minute closes; then every reducer
    restarts while mapper 1 cannot be reached, and mapper 0 reads on. The watermark of
    rows a new instance has not fetched again must not close a pane (the bug this
    catches: storing the watermark of pending rows, not only of finished ones)."""
    tables = stream(2, 25_000, disorder=100)
    c, sink = _cluster(tmp_path, tables, reducer)
    for _ in range(200):  # 100-row batches of 1 s of events
        c.mappers[1].ingest_once()
    for _ in range(70):
        c.mappers[0].ingest_once()
    for _ in range(150):
        for worker in c.reducers.values():
            worker.run_once()
    assert set(sink.read()["window_start"].to_pylist()) == {0}, "the first minute closed"
    for r in range(2):
        c.start_reducer(r)
    address = next(a for a, h in c.handlers.items() if h is c.mappers[1])
    away = c.handlers.pop(address)
    for _ in range(100):
        c.mappers[0].ingest_once()
        for worker in c.reducers.values():
            worker.run_once()
    c.handlers[address] = away
    c.run_to_end()
    for worker in c.reducers.values():
        assert worker.finish()
    _check(
        sink.read().sort_by([("window_start", "ascending"), ("key", "ascending")]),
        expected(tables, MINUTE, MINUTE),
        MINUTE,
    )
