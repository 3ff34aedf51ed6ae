"""The embedded store's runs of a commit: ``add_many`` batches of one width made one after
another become one run together, and read back as the table would hold them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest
from millstream.state import Store, open_store
from millstream.state.sqlite import run_writer
from millstream.state.sqlite.write_buffer import (
    BatchAdd,
    BatchSet,
    ClearRange,
    PointOps,
    run_stretches,
)


def _counts(path: Path) -> tuple[int, int]:
    """Runs and table rows of the store at ``path``."""
    conn = sqlite3.connect(path)
    try:
        runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM kv").fetchone()[0]
    finally:
        conn.close()
    return runs, rows


def _panes(txn, panes: range, keys: int, width: int = 2) -> None:
    """One ``add_many`` per pane, as a second stage storing each pane's results does."""
    for pane in panes:
        ids = pa.array(range(keys), pa.int64())
        if width == 1:
            txn.add_many(("result", pane), ids, pa.array([pane + 1] * keys, pa.int64()))
        else:
            columns = {f"c{n}": pa.array([pane + n] * keys, pa.int64()) for n in range(width)}
            txn.add_many(("result", pane), ids, pa.record_batch(columns))


def _everything(store: Store) -> list[tuple[tuple, bytes]]:
    with store.read() as txn:
        return txn.get_range_startswith(())


def _stores(tmp_path: Path) -> tuple[Store, Store]:
    """A store with the default ``run_min_keys`` and one that never makes runs."""
    return (
        open_store(f"sqlite:///{tmp_path / 'runs.db'}"),
        open_store(f"sqlite:///{tmp_path / 'table.db'}?run_min_keys=0"),
    )


def test_batches_next_to_each_other_in_a_commit_are_one_run(tmp_path: Path) -> None:
    """Twenty panes of 50 keys each (fewer than ``run_min_keys`` alone) are one run: no
    table rows, and the same values as a store without runs."""
    runs, table = _stores(tmp_path)
    for store in (runs, table):
        store.transact(lambda txn: _panes(txn, range(20), 50))
    assert _counts(tmp_path / "runs.db") == (1, 0)
    assert _counts(tmp_path / "table.db") == (0, 1000)
    assert _everything(runs) == _everything(table)
    for store in (runs, table):
        store.transact(lambda txn: _panes(txn, range(10, 30), 50))
    assert _counts(tmp_path / "runs.db") == (2, 0)
    assert _everything(runs) == _everything(table)
    runs.close()
    table.close()


def test_a_write_between_batches_ends_their_stretch(tmp_path: Path) -> None:
    """A set between two batches of one pane keeps them apart and comes between their
    adds, as written: two batches under the threshold stay in the table; two over it are
    two runs, the first folded into the table by the set of a key it holds."""
    runs, table = _stores(tmp_path)

    def split(txn, keys: int) -> None:
        _panes(txn, range(1), keys)
        txn.set(("result", 0, 3), b"\x00" * 16)
        _panes(txn, range(1), keys)

    for store in (runs, table):
        store.transact(lambda txn: split(txn, 200))
    assert _counts(tmp_path / "runs.db") == (0, 200)
    assert _everything(runs) == _everything(table)
    for store in (runs, table):
        store.transact(lambda txn: split(txn, 300))
    assert _counts(tmp_path / "runs.db") == (1, 300)
    assert _everything(runs) == _everything(table)
    runs.close()
    table.close()


def test_a_batch_of_another_width_starts_a_stretch_of_its_own(tmp_path: Path) -> None:
    """Adds of different widths do not commute on a key, so they are not one run: 200
    keys of one counter beside 200 of two stay in the table; 200 beside 100 of the same
    width are one run."""
    runs, table = _stores(tmp_path)
    for store in (runs, table):
        store.transact(
            lambda txn: (_panes(txn, range(1), 200, width=1), _panes(txn, range(1, 2), 200))
        )
    assert _counts(tmp_path / "runs.db") == (0, 400)
    for store in (runs, table):
        store.transact(lambda txn: (_panes(txn, range(2, 3), 200), _panes(txn, range(3, 4), 100)))
    assert _counts(tmp_path / "runs.db") == (1, 400)
    assert _everything(runs) == _everything(table)
    runs.close()
    table.close()


def test_a_commit_that_fails_writing_a_run_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit of two stretches whose second run fails to be written leaves the store
    as it was (no run, no key); the same commit again writes both."""
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}")
    insert = run_writer.insert_run
    calls: list[int] = []

    def failing_second(conn, encoded, order):
        calls.append(order)
        if len(calls) == 2:
            raise OSError("disk full")
        return insert(conn, encoded, order)

    def two_stretches(txn) -> None:
        _panes(txn, range(10), 50)
        txn.set(("between",), b"1")
        _panes(txn, range(10, 20), 50)

    monkeypatch.setattr(run_writer, "insert_run", failing_second)
    with pytest.raises(OSError, match="disk full"):
        store.transact(two_stretches)
    assert _counts(path) == (0, 0)
    assert _everything(store) == []
    monkeypatch.setattr(run_writer, "insert_run", insert)
    store.transact(two_stretches)
    assert _counts(path) == (2, 1)
    assert len(_everything(store)) == 1 + 20 * 50
    store.close()


def test_stretches_of_a_log() -> None:
    """Which batches of a log are runs together."""

    def batch(keys: int, width: int = 1) -> BatchAdd:
        if width == 1:
            return BatchAdd([b"k%d" % i for i in range(keys)], [1] * keys)
        return BatchAdd([b"k%d" % i for i in range(keys)], [b"\x01" * 8 * width] * keys)

    a, b, c, d, e = batch(3), batch(2), batch(2, width=2), batch(4, width=2), batch(5)
    log = [a, b, PointOps(), c, d, BatchSet([b"x"], [b"1"]), e, ClearRange(b"a", b"b")]
    assert run_stretches(log, 5) == [[a, b], [c, d], [e]]
    assert run_stretches(log, 6) == [[c, d]]
    assert run_stretches(log, 0) == []
    assert run_stretches([a, c, b], 1) == [[a], [c], [b]]
