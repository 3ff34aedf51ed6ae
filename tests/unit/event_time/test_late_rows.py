"""Late rows: counted in input rows by both pane reducers, in the transaction of the batch
that brought them (a failed commit counts nothing, a repeated one once), sent to the late
output; the pending reducer tells them from rows it sees again. Idle partitions: the rule,
and a partition that stops sending rows no longer holds the panes."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.event_time.watermark import END_OF_TIME, IdlePartitions, watermark
from millstream.exceptions import ConfigurationError
from millstream.outputs import ParquetSink, StagedOutputs
from millstream.state import open_store
from millstream.testing import MemoryInput, run_in_process

from tests.support.event_time import MINUTE, commit_round, stream

REDUCERS = [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer]


def _rows(ts: list[int], keys: list[int], values: list[int] | None = None) -> pa.Table:
    return pa.table(
        {
            "ts": pa.array(ts, pa.int64()),
            "key": pa.array(keys, pa.int64()),
            "value": pa.array(values or [1] * len(ts), pa.int64()),
        }
    )


def _late_out(sink: ParquetSink) -> list[tuple[int, int, int, int]]:
    table = sink.read()
    columns = ["window_start", "window_end", "key", "total"]
    return sorted(zip(*(table[c].to_pylist() for c in columns), strict=True))


@pytest.mark.parametrize("reducer", REDUCERS, ids=["stored", "pending"])
@pytest.mark.parametrize(
    "aggregates",
    [{"total": ("value", "sum")}, {"n": (None, "count"), "total": ("value", "sum")}],
    ids=["no-count", "count"],
)
def test_late_rows_are_counted_in_input_rows_and_sent_to_the_late_output(
    tmp_path: Path, reducer: type[ms.Reducer], aggregates: dict[str, tuple[str | None, str]]
) -> None:
    on_time = stream(1, 20_000, disorder=0)[0]
    late = _rows([5, 6, 61_000, 61_001, 61_002], [1, 1, 2, 3, 3], [7, 8, 9, 10, 11])
    url = f"sqlite:///{tmp_path / 'state.db'}"
    panes_sink = ParquetSink(url, "panes", str(tmp_path / "panes"))
    late_sink = ParquetSink(url, "late", str(tmp_path / "late"))
    panes = ms.event_time.Panes(
        time="ts", key="key", size=MINUTE, aggregates=aggregates, output="panes", late_output="late"
    )
    processor = ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=reducer,
        input=MemoryInput([pa.concat_tables([on_time, late])]),
        store=url,
        num_reducers=2,
        config={"panes": panes},
        outputs=[panes_sink, late_sink],
        tuning=ms.Tuning(batch_rows=500),
    )
    run_in_process(processor)
    assert ms.event_time.late_rows(processor) == 5
    assert _late_out(late_sink) == [
        (0, MINUTE, 1, 15),
        (MINUTE, 2 * MINUTE, 2, 9),
        (MINUTE, 2 * MINUTE, 3, 21),
    ]
    emitted = panes_sink.read()
    assert pc.sum(emitted["total"]).as_py() == pc.sum(on_time["value"]).as_py()
    starts = emitted["window_start"].to_pylist()
    assert len(set(zip(starts, emitted["key"].to_pylist(), strict=True))) == len(starts)


def test_the_pending_reducer_tells_late_rows_from_rows_it_sees_again(tmp_path: Path) -> None:
    """Round 1 closes pane 0; a row of it stays pending behind a row of the open pane 1
    and comes again in round 2 with a row for pane 0 that arrived after it closed: only
    that one is late. Round 2's first transaction fails; repeated, it counts once."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    panes_sink = ParquetSink(url, "panes", str(tmp_path / "panes"))
    late_sink = ParquetSink(url, "late", str(tmp_path / "late"))
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        aggregates={"total": ("value", "sum")},
        output="panes",
        late_output="late",
    )
    config = {"panes": panes}
    mapper = ms.event_time.PaneMapper(ms.WorkerSpec("p", "mapper", 0, "m", 1, 1), config)

    def mapped(ts: list[int], keys: list[int]) -> pa.Table:
        batch = _rows(ts, keys).to_batches()[0]
        return pa.Table.from_batches([mapper.map(batch).batch])

    def pending(rows: pa.Table) -> ms.PendingRows:
        return ms.PendingRows(rows, np.zeros(rows.num_rows, np.int32), frozenset(), rows.num_rows)

    store = open_store(url, prefix=("p",))
    reducer = ms.event_time.PendingPaneReducer(ms.WorkerSpec("p", "reducer", 0, "r", 1, 1), config)
    # Per batch: pane 0's row, pane 1's row, the watermark row.
    first = pending(
        pa.concat_tables([mapped([10_000, 70_000], [1, 1]), mapped([20_000, 80_000], [2, 2])])
    )
    commit_round(store, [panes_sink, late_sink], lambda t: reducer.process(first, t))
    reducer.on_commit()
    done = first.finished_prefix()[0]
    assert done == 1, "pane 1's row holds the rest pending"
    assert _late_out(panes_sink) == [(0, MINUTE, 1, 1), (0, MINUTE, 2, 1)]

    again = pa.concat_tables([first.rows.slice(done), mapped([30_000, 90_000], [3, 3])])
    failed = store.create_transaction()
    reducer.process(pending(again), ms.Transaction(failed, StagedOutputs([late_sink], "r", 0)))
    failed.reset()  # the commit failed: no on_commit
    second = pending(again)
    commit_round(store, [panes_sink, late_sink], lambda t: reducer.process(second, t))
    reducer.on_commit()
    assert reducer.figures() == {"late_rows": 1}
    assert _late_out(late_sink) == [(0, MINUTE, 3, 1)]
    assert _late_out(panes_sink) == [(0, MINUTE, 1, 1), (0, MINUTE, 2, 1)]
    with store.read() as txn:
        assert ms.Transaction(txn).get_int(("~windows", 0, "late")) == 1
    store.close()


def test_a_partition_is_idle_once_its_latest_time_stays_for_the_timeout() -> None:
    now = [0.0]
    idle = IdlePartitions(10.0, clock=lambda: now[0])
    assert idle.idle({0: 5}, [0, 1]) == frozenset()
    now[0] = 9.0
    assert idle.idle({0: 6}, [0, 1]) == frozenset()
    now[0] = 10.0  # partition 1 never reported: idle since the first look
    assert idle.idle({0: 6}, [0, 1]) == {1}
    now[0] = 19.0
    assert idle.idle({0: 6, 1: 3}, [0, 1]) == {0}
    now[0] = 30.0
    assert idle.idle({0: 7, 1: 3}, [0, 1]) == {1}
    assert IdlePartitions(None, clock=lambda: now[0]).idle({}, [0, 1]) == frozenset()


def test_the_watermark_leaves_out_ended_and_idle_partitions() -> None:
    now = [0.0]
    idle = IdlePartitions(5.0, clock=lambda: now[0])
    marks = {0: 100, 1: 40, 2: 70}
    assert watermark(marks, 3, frozenset(), idle) == 40
    assert watermark(marks, 3, frozenset({1}), idle) == 70
    now[0] = 5.0
    assert watermark({0: 100, 1: 40, 2: 75}, 3, frozenset(), idle) == 75
    assert watermark({0: 100, 1: 40, 2: 75}, 3, frozenset({0, 1, 2}), idle) == END_OF_TIME
    assert watermark({0: 100}, 3, frozenset(), IdlePartitions(None)) is None
    now[0] = 20.0  # every partition idle: the latest time any of them reported
    assert watermark({0: 100, 1: 40, 2: 75}, 3, frozenset(), idle) == 100
    assert watermark({}, 3, frozenset(), idle) is None


def test_idle_partitions_are_due_when_a_timeout_runs_out_with_no_new_time() -> None:
    now = [0.0]
    idle = IdlePartitions(10.0, clock=lambda: now[0])
    assert not idle.due()  # nothing looked at yet
    idle.idle({0: 5, 1: 3}, [0, 1])
    now[0] = 4.0
    idle.idle({0: 6, 1: 3}, [0, 1])  # partition 1's time stays from 0 s, partition 0's from 4 s
    now[0] = 9.9
    assert not idle.due()
    now[0] = 10.0
    assert idle.due()  # partition 1's timeout ran out, with no new row
    assert idle.idle({0: 6, 1: 3}, [0, 1]) == {1}
    assert not idle.due()
    now[0] = 14.0
    assert idle.due()  # partition 0's too
    assert idle.idle({0: 6, 1: 3}, [0, 1]) == {0, 1}
    now[0] = 1_000.0
    assert not idle.due()  # every one idle: nothing more turns idle
    assert not IdlePartitions(None, clock=lambda: now[0]).due()


@pytest.mark.parametrize("reducer", REDUCERS, ids=["stored", "pending"])
def test_a_partition_that_stops_no_longer_holds_the_panes(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    """Partition 1 sends one row, then nothing while partition 0 moves on: with a timeout
    (shorter than any round) its panes close on partition 0's time; a row partition 1
    sends afterwards for a closed pane is late, one for an open pane counts."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "panes"))
    late_sink = ParquetSink(url, "late", str(tmp_path / "late"))
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        aggregates={"total": ("value", "sum")},
        output="panes",
        late_output="late",
        idle_timeout=1e-9,
    )
    config = {"panes": panes}
    mappers = [
        ms.event_time.PaneMapper(
            ms.WorkerSpec("p", "mapper", m, "m", 2, 1, num_partitions=2), config
        )
        for m in range(2)
    ]
    spec = ms.WorkerSpec("p", "reducer", 0, "r", 2, 1, num_partitions=2)
    user = reducer(spec, config)
    store = open_store(url, prefix=("p",))
    queue: dict[int, pa.Table] = {}  # the pending reducer's rows, per partition

    def send(partition: int, ts: list[int]) -> None:
        rows = _rows(ts, [partition] * len(ts)).to_batches()[0]
        mapped = pa.Table.from_batches([mappers[partition].map(rows).batch])
        if isinstance(user, ms.event_time.PendingPaneReducer):
            held = queue.get(partition)
            queue[partition] = mapped if held is None else pa.concat_tables([held, mapped])
            order = sorted(queue)
            where = np.concatenate([np.full(queue[p].num_rows, p, np.int32) for p in order])
            pending = ms.PendingRows(
                pa.concat_tables([queue[p] for p in order]), where, frozenset(), mapped.num_rows
            )
            commit_round(store, [sink, late_sink], lambda t: user.process(pending, t))
            for p, done in pending.finished_prefix().items():
                queue[p] = queue[p].slice(done)
        else:
            commit_round(store, [sink, late_sink], lambda t: user.reduce(mapped.to_batches()[0], t))
        user.on_commit()

    send(1, [1_000])
    for minute in range(4):
        send(0, [minute * MINUTE + 10, minute * MINUTE + 30_000])
    closed = sink.read()
    assert sorted(closed["window_start"].to_pylist()) == [0, 0, MINUTE, 2 * MINUTE]
    assert pc.sum(closed["total"]).as_py() == 7
    send(1, [5_000, 4 * MINUTE])
    assert user.figures() == {"late_rows": 1}
    assert _late_out(late_sink) == [(0, MINUTE, 1, 1)]
    store.close()


def test_bad_late_and_idle_options_are_refused() -> None:
    def panes(**options: object) -> ms.event_time.Panes:
        return ms.event_time.Panes(
            time="ts",
            key="key",
            size=MINUTE,
            aggregates={"n": (None, "count")},
            output="panes",
            **options,  # type: ignore[arg-type]
        )

    with pytest.raises(ConfigurationError, match="late rows go to an output of their own"):
        panes(late_output="panes")
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(ConfigurationError, match="idle_timeout"):
            panes(idle_timeout=bad)
    assert panes(idle_timeout=dt.timedelta(seconds=3)).idle_seconds == 3.0
    assert panes().idle_seconds is None


@pytest.mark.parametrize("kind", REDUCERS, ids=["stored", "pending"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.lists(st.integers(0, 6 * MINUTE), min_size=1, max_size=5), min_size=1, max_size=10
    ),
    rounds=st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), min_size=1, max_size=12
    ),
)
def test_every_row_counts_once_in_its_pane_or_late_whatever_fails(
    kind: type[ms.Reducer], batches: list[list[int]], rounds: list[tuple[int, bool, bool]]
) -> None:
    """Batches of two partitions arrive over rounds (the stored reducer reduces the rows
    not committed yet, the pending one processes its pending rows); a round's commit may
    fail, and the reducer may restart (a new instance) between rounds. The panes emitted
    (each once) plus the late output equal the panes of every row, and the count is the
    late output's."""
    panes = ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        aggregates={"n": (None, "count"), "total": ("value", "sum")},
        output="panes",
        late_output="late",
    )
    config = {"panes": panes}
    spec = ms.WorkerSpec("p", "reducer", 0, "r", 2, 1, num_partitions=2)
    mappers = [
        ms.event_time.PaneMapper(
            ms.WorkerSpec("p", "mapper", m, "m", 2, 1, num_partitions=2), config
        )
        for m in range(2)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/state.db"
        sinks = [ParquetSink(url, name, f"{tmp}/{name}") for name in ("panes", "late")]
        store = open_store(url, prefix=("p",))
        queue: dict[int, pa.Table] = {}
        reducer = kind(spec, config)
        arriving = list(enumerate(batches))

        def round_(ended: frozenset[int], fail: bool) -> None:
            order = [p for p in sorted(queue) if queue[p].num_rows]
            if not order:
                return
            where = np.concatenate([np.full(queue[p].num_rows, p, np.int32) for p in order])
            table = pa.concat_tables([queue[p] for p in order])
            pending = ms.PendingRows(table, where, ended, table.num_rows)
            txn = store.create_transaction()
            outputs = StagedOutputs(sinks, "reducer-0", 0)
            if isinstance(reducer, ms.QueueReducer):
                reducer.process(pending, ms.Transaction(txn, outputs))
            else:
                reducer.drained_partitions = ended
                reducer.reduce(table.combine_chunks().to_batches()[0], ms.Transaction(txn, outputs))
                pending.finish_all()
            if fail:
                txn.reset()
                return
            outputs.apply(txn)
            txn.commit()
            outputs.publish()
            reducer.on_commit()
            for p, done in pending.finished_prefix().items():
                queue[p] = queue[p].slice(done)

        def arrive(i: int, ts: list[int]) -> None:
            rows = _rows(ts, [t % 3 for t in ts], [t % 10 for t in ts]).to_batches()[0]
            mapped = pa.Table.from_batches([mappers[i % 2].map(rows).batch])
            held = queue.get(i % 2)
            queue[i % 2] = mapped if held is None else pa.concat_tables([held, mapped])

        for count, fail, restart in rounds:
            for i, ts in arriving[:count]:
                arrive(i, ts)
            del arriving[:count]
            if restart:
                reducer = kind(spec, config)
            round_(frozenset(), fail)
        for i, ts in arriving:
            arrive(i, ts)
        round_(frozenset({0, 1}), fail=False)
        assert all(not t.num_rows for t in queue.values()), "the end of input finishes every row"
        commit_round(store, sinks, reducer.drain)

        emitted, late = (sink.read() for sink in sinks)
        got: dict[tuple[int, int], list[int]] = {}
        for table in (emitted, late):
            if table.num_rows:
                for start, key, n, total in zip(
                    *(table[c].to_pylist() for c in ("window_start", "key", "n", "total")),
                    strict=True,
                ):
                    have = got.setdefault((start, key), [0, 0])
                    have[0] += n
                    have[1] += total
        want: dict[tuple[int, int], list[int]] = {}
        for t in (t for ts in batches for t in ts):
            have = want.setdefault((t // MINUTE * MINUTE, t % 3), [0, 0])
            have[0] += 1
            have[1] += t % 10
        assert got == want
        starts = emitted["window_start"].to_pylist() if emitted.num_rows else []
        keys = emitted["key"].to_pylist() if emitted.num_rows else []
        assert len(set(zip(starts, keys, strict=True))) == len(starts), "a pane emitted twice"
        with store.read() as txn:
            counted = ms.Transaction(txn).get_int(("~windows", 0, "late"))
        assert counted == (sum(late["n"].to_pylist()) if late.num_rows else 0)
        store.close()
