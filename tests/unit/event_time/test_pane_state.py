"""The pane reducers' stored state: open panes' partials under their key groups (read
back from an earlier layout kept per reducer), the handover of their per-reducer records
when a rescale changes the reducer count, and pending partials stored at a rescale."""

from __future__ import annotations

from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from millstream.exceptions import ConfigurationError
from millstream.outputs import ParquetSink
from millstream.state import open_store
from millstream.state.keys import pack, unpack

from tests.support.event_time import MINUTE, commit_round, stream

PANES = ms.event_time.Panes(
    time="ts", key="key", size=MINUTE, aggregates={"n": (None, "count")}, output="panes"
)


def test_partials_kept_per_reducer_by_an_earlier_layout_are_moved_and_counted(
    tmp_path: Path,
) -> None:
    """The first batch commits; its partials are then put where an earlier release kept
    them (under the reducer's index); a new reducer instance reads them, moves them under
    their key groups, and every row is counted once."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "out"))
    rows = stream(1, 3_000, disorder=0)[0]
    config = {"panes": PANES}
    mapper = ms.event_time.PaneMapper(ms.WorkerSpec("p", "mapper", 0, "m", 1, 1), config)
    store = open_store(url, prefix=("p",))
    batches = [mapper.map(b).batch for b in rows.to_batches(max_chunksize=1_000)]

    def commit(reducer: ms.Reducer, batch: pa.RecordBatch | None) -> None:
        if batch is None:
            commit_round(store, sink, reducer.drain)
        else:
            commit_round(store, sink, lambda t: reducer.reduce(batch, t))
        reducer.on_commit()

    def spec() -> ms.WorkerSpec:
        return ms.WorkerSpec("p", "reducer", 0, "r", 1, 1)

    commit(ms.event_time.PaneReducer(spec(), config), batches[0])
    txn = store.create_transaction()
    t = ms.Transaction(txn)
    stored = t.get_range(("~windows", "partial"))
    assert stored, "the first batch left open panes"
    for key, value in stored:
        t.clear(key)
        t.set(("~windows", 0, "partial", *key[3:]), value)
    txn.commit()

    restarted = ms.event_time.PaneReducer(spec(), config)
    for batch in batches[1:]:
        commit(restarted, batch)
    with store.read() as txn:
        assert ms.Transaction(txn).get_range(("~windows", 0, "partial")) == []
    commit(restarted, None)
    assert pc.sum(sink.read()["n"]).as_py() == 3_000
    store.close()


def test_a_rescale_gives_every_new_reducer_the_old_watermarks(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", prefix=("p",))
    txn = store.create_transaction()
    t = ms.Transaction(txn)
    for r, marks, closed, late in [(0, (0, 100, 1, 200), 80, 2), (1, (0, 90, 1, 250), 95, 3)]:
        t.set(("~windows", r, "watermarks"), pack(marks))
        t.set(("~windows", r, "closed"), pack((closed,)))
        t.set(("~windows", r, "schema"), b"schema")
        t.add(("~windows", r, "late"), late)
    t.set(("~windows", "partial", 7, 0, 1), b"partial")
    ms.event_time.PaneReducer.on_rescale(t, 2, 3)
    txn.commit()
    with store.read() as txn:
        t = ms.Transaction(txn)
        for r in range(3):
            # Per mapper the watermark every old reducer had reached; the latest close.
            assert unpack(t.get(("~windows", r, "watermarks")) or b"") == (0, 90, 1, 200)
            assert unpack(t.get(("~windows", r, "closed")) or b"") == (95,)
            assert t.get(("~windows", r, "schema")) == b"schema"
        assert [t.get_int(("~windows", r, "late")) for r in range(3)] == [5, 0, 0]
        assert t.get(("~windows", "partial", 7, 0, 1)) == b"partial"
    store.close()


def test_a_rescale_refuses_partials_kept_per_reducer(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}", prefix=("p",))
    txn = store.create_transaction()
    t = ms.Transaction(txn)
    t.set(("~windows", 1, "partial", 0, 5), b"partial")
    with pytest.raises(ConfigurationError, match="start the processor once"):
        ms.event_time.PaneReducer.on_rescale(t, 2, 1)
    txn.reset()
    store.close()


def test_pending_partials_handed_over_are_emitted_by_the_new_owners(tmp_path: Path) -> None:
    """One reducer hands over its pending rows (open panes' partials stored by key
    group); two new reducers that get no row afterwards emit them when the input ends,
    each its own key groups', every row counted once."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    sink = ParquetSink(url, "panes", str(tmp_path / "out"))
    rows = stream(1, 3_000, disorder=0)[0]
    config = {"panes": PANES}
    mapper = ms.event_time.PaneMapper(ms.WorkerSpec("p", "mapper", 0, "m", 1, 1), config)
    mapped = pa.concat_tables(
        pa.Table.from_batches([mapper.map(b).batch]) for b in rows.to_batches(max_chunksize=500)
    )
    store = open_store(url, prefix=("p",))

    old = ms.event_time.PendingPaneReducer(ms.WorkerSpec("p", "reducer", 0, "r", 1, 1), config)
    pending = ms.PendingRows(mapped, np.zeros(mapped.num_rows, np.int32), frozenset({0}), 0)
    commit_round(store, sink, lambda t: old.hand_over(pending, t))
    assert pending.finished().to_pylist() == [True] * mapped.num_rows
    commit_round(store, sink, lambda t: ms.event_time.PendingPaneReducer.on_rescale(t, 1, 2))
    assert sink.read().num_rows == 0, "no pane was emitted at the handover"
    for r in range(2):
        new = ms.event_time.PendingPaneReducer(ms.WorkerSpec("p", "reducer", r, "r", 1, 2), config)
        commit_round(store, sink, new.drain, r)
    got = sink.read()
    assert pc.sum(got["n"]).as_py() == 3_000
    panes = zip(got["window_start"].to_pylist(), got["key"].to_pylist(), strict=True)
    assert got.num_rows == len(set(panes)), "a pane was emitted twice"
    with store.read() as txn:
        assert ms.Transaction(txn).get_range(("~windows", "partial")) == []
    store.close()
