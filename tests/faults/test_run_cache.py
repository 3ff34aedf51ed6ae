"""The decoded delta runs a process keeps, after a commit that wrote runs failed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest
from millstream.exceptions import StoreUnavailableError
from millstream.state import StoreTransaction, open_store
from millstream.state.keys import encode_int64

from tests.support.sqlite_faults import PLAN, open_faulty


@pytest.mark.parametrize("kind", ["io", "full"])
def test_a_run_of_a_failed_commit_is_not_read_under_its_reused_id(
    tmp_path: Path, kind: str
) -> None:
    """Issue 42, item 1: the failed commit's run, decoded while it folded the runs into
    the table, must not stand for the run SQLite next stores under the same id."""
    store = open_faulty(tmp_path / "store.db")
    try:

        def add_then_set(txn: StoreTransaction) -> None:
            txn.add_many(("k",), [0, 1], [100, 100])
            txn.set(("k", 1), encode_int64(7))  # folds the run into the table first

        PLAN.arm(0, kind, match="COMMIT")
        with pytest.raises(StoreUnavailableError):
            store.transact(add_then_set, max_retries=0)
        assert PLAN.fired
        PLAN.arm(None)
        store.transact(lambda txn: txn.add_many(("k",), [0, 2], [1, 1]))
        with store.read() as txn:
            assert txn.get(("k", 0)) == encode_int64(1)
            assert txn.get(("k", 1)) is None
        # A set on a key the run holds folds the runs into the table, for good.
        store.transact(lambda txn: txn.set(("k", 2), encode_int64(5)))
        with store.read() as txn:
            assert txn.get(("k", 0)) == encode_int64(1)
    finally:
        PLAN.arm(None)
        store.close()


def test_runs_of_a_version_3_store_read_without_a_generation(tmp_path: Path) -> None:
    """Stores of schema version 3 have no generation column: opening adds it, empty."""
    path = tmp_path / "v3.db"
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    for n in range(3):
        store.transact(lambda txn, n=n: txn.add_many(("n",), [0, n + 1], [1, 2]))
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE runs DROP COLUMN generation")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    store.transact(lambda txn: txn.add_many(("n",), pa.array([0]), pa.array([4])))
    with store.read() as txn:
        assert txn.get(("n", 0)) == encode_int64(7)
        assert [txn.get(("n", k)) for k in (1, 2, 3)] == [encode_int64(2)] * 3
    store.close()
    conn = sqlite3.connect(path)
    generations = [row[0] for row in conn.execute("SELECT generation FROM runs ORDER BY ord")]
    assert generations[:3] == [None] * 3
    assert generations[3] is not None
    conn.close()
