"""Opening a store of schema version 4 (its runs' ``generation`` stored after their
``data``) moves the runs into a table with ``data`` last: the values, ids, generations and
id sequence stay; a failure or a kill at any statement of the upgrade leaves the store as
it was, and the next open upgrades it."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest
from millstream.exceptions import StoreError
from millstream.state import open_store
from millstream.state.keys import encode_int64
from millstream.state.sqlite.sql import SCHEMA_VERSION

from tests.faults.test_sqlite_process_faults import in_child
from tests.support.sqlite_faults import PLAN, open_faulty

KEYS = 5


def _version_4_store(path: Path) -> dict[str, object]:
    """A store with delta runs (and ids given to runs merged away), laid out as version 4
    wrote it; returns what the upgrade must keep."""
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    for n in range(4):
        store.transact(lambda txn, n=n: txn.add_many(("n",), list(range(KEYS)), [n + 1] * KEYS))
    store.close()
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE runs_v4 (id INTEGER PRIMARY KEY AUTOINCREMENT, ord INTEGER NOT NULL, "
        "lo BLOB NOT NULL, hi BLOB NOT NULL, width INTEGER NOT NULL, entries INTEGER NOT NULL, "
        "data BLOB NOT NULL, generation BLOB)"
    )
    conn.execute(
        "INSERT INTO runs_v4 SELECT id, ord, lo, hi, width, entries, data, generation FROM runs"
    )
    (sequence,) = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'runs'").fetchone()
    sequence += 5  # ids given to runs merged away since
    conn.execute("DROP TABLE runs")
    conn.execute("ALTER TABLE runs_v4 RENAME TO runs")
    conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'runs'", (sequence,))
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    runs = conn.execute("SELECT id, generation, data FROM runs ORDER BY ord").fetchall()
    conn.close()
    return {"runs": runs, "sequence": sequence}


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    finally:
        conn.close()


def _check_upgraded(path: Path, before: dict[str, object]) -> None:
    open_store(f"sqlite:///{path}").close()
    assert _columns(path)[-2:] == ["generation", "data"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert (
        conn.execute("SELECT id, generation, data FROM runs ORDER BY ord").fetchall()
        == (before["runs"])
    )
    (sequence,) = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'runs'").fetchone()
    assert sequence == before["sequence"]
    conn.close()
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    try:
        with store.read() as txn:
            assert [txn.get(("n", k)) for k in range(KEYS)] == [encode_int64(1 + 2 + 3 + 4)] * KEYS
        store.transact(lambda txn: txn.add_many(("n",), [0], [10]))
        with store.read() as txn:
            assert txn.get(("n", 0)) == encode_int64(20)
            runs = txn._runs  # type: ignore[attr-defined]
        assert runs[-1].id > before["sequence"]  # no id given twice
    finally:
        store.close()


def _upgrade_steps(path: Path) -> int:
    """How many statements opening the store at ``path`` runs (it upgrades it)."""
    PLAN.arm(None)
    open_faulty(path).close()
    return PLAN.steps


def test_a_version_4_store_is_upgraded_keeping_every_run(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    before = _version_4_store(path)
    assert _columns(path)[-1] == "generation"
    _check_upgraded(path, before)


@pytest.mark.parametrize("kind", ["io", "full", "locked"])
def test_a_failed_statement_of_the_upgrade_leaves_the_store_as_it_was(
    tmp_path: Path, kind: str
) -> None:
    template = tmp_path / "template.db"
    before = _version_4_store(template)
    steps = _upgrade_steps(Path(shutil.copy(template, tmp_path / "count.db")))
    assert steps > 8  # the open's own statements, then the upgrade's
    for at in range(steps):
        path = Path(shutil.copy(template, tmp_path / f"{at}.db"))
        PLAN.arm(at, kind)
        try:
            open_faulty(path).close()
            opened = True
        except StoreError:
            opened = False
        finally:
            fired = PLAN.fired
            PLAN.arm(None)
        assert fired
        # A busy answer may be waited out where the backend retries it; an I/O error or a
        # full disk fails the open, and nothing of the upgrade landed.
        assert not opened or kind == "locked"
        if not opened:
            assert _columns(path)[-1] == "generation"
        _check_upgraded(path, before)


def test_a_kill_at_any_statement_of_the_upgrade_leaves_the_store_as_it_was(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template.db"
    before = _version_4_store(template)
    steps = _upgrade_steps(Path(shutil.copy(template, tmp_path / "count.db")))
    for at in range(steps):
        path = Path(shutil.copy(template, tmp_path / f"{at}.db"))

        def open_killed(fd: int, path: Path = path, at: int = at) -> None:
            PLAN.arm(at, "kill")
            open_faulty(path).close()

        status, lines = in_child(open_killed)
        assert os.WIFSIGNALED(status), lines
        assert os.WTERMSIG(status) == signal.SIGKILL, lines
        _check_upgraded(path, before)


def test_a_new_store_keeps_each_runs_data_last(tmp_path: Path) -> None:
    """Listing the runs (at the start of every transaction) must not read their data."""
    path = tmp_path / "new.db"
    open_store(f"sqlite:///{path}").close()
    assert _columns(path)[-1] == "data"
