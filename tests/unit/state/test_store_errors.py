"""Clear errors for bad URLs, unreachable, locked or corrupted stores and a missing libfdb_c."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from millstream.exceptions import (
    ConfigurationError,
    StoreCorruptError,
    StoreUnavailableError,
)
from millstream.state import open_store, parse_store_url
from millstream.state.sqlite.sql import begin_transaction as _begin


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("/tmp/x.db", "scheme"),
        ("sqlite://relative/x.db", "three slashes"),
        ("sqlite:///", "absolute file path"),
        ("postgres:///x", "unknown scheme"),
        ("sqlite:///tmp/x.db?cache=big", "unknown option"),
        ("sqlite:///tmp/x.db?busy_timeout_ms=soon", "integer"),
        ("sqlite:///tmp/x.db?synchronous=off", "synchronous"),
        ("sqlite:///tmp/x.db?checkpoint_pages=-1", "checkpoint_pages must be >= 0"),
        ("sqlite:///tmp/x.db?secure_delete=zero", "secure_delete must be fast, on or off"),
        ("fdb://host:4500", "cluster file"),
    ],
)
def test_bad_urls_list_the_accepted_forms(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why) as info:
        open_store(url)
    assert "sqlite:///absolute/path/to/file.db" in str(info.value)
    assert "fdb:///path/to/fdb.cluster" in str(info.value)


def test_good_urls_parse() -> None:
    assert parse_store_url("sqlite:///a/b.db").path == "/a/b.db"
    assert parse_store_url("fdb://").path is None
    assert parse_store_url("fdb:///etc/foundationdb/fdb.cluster").path == (
        "/etc/foundationdb/fdb.cluster"
    )


def test_checkpoint_pages_bound_the_log(tmp_path: Path) -> None:
    path = tmp_path / "small-log.db"
    store = open_store(f"sqlite:///{path}?checkpoint_pages=8")
    for i in range(40):
        store.transact(lambda t, i=i: t.set(("k", i), bytes(8_000)))
    # Every commit writes at least three pages; the log is copied back after eight, and
    # the next commit starts it over.
    assert os.stat(f"{path}-wal").st_size < 40 * 4096
    store.close()


def _log_bytes_of_a_delete(path: Path, options: str) -> int:
    """Bytes of write-ahead log one transaction deleting ~1 MB of values writes."""
    store = open_store(f"sqlite:///{path}?checkpoint_pages=0{options}")  # the log only grows
    keys = [("big", i) for i in range(12)]
    store.transact(lambda t: [t.set(key, os.urandom(90_000)) for key in keys])
    before = os.stat(f"{path}-wal").st_size
    store.transact(lambda t: [t.clear(key) for key in keys])
    grew = os.stat(f"{path}-wal").st_size - before
    store.close()
    return grew


def test_deleted_values_are_not_written_again_as_zeros(tmp_path: Path) -> None:
    # SQLite built with SQLITE_SECURE_DELETE (Debian's) zeroes every freed page by default:
    # each trimmed queue row or merged run would be written twice.
    assert _log_bytes_of_a_delete(tmp_path / "default.db", "") < 64 * 1024
    assert _log_bytes_of_a_delete(tmp_path / "on.db", "&secure_delete=on") > 1_000_000


def test_missing_directory_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "x.db"
    with pytest.raises(StoreUnavailableError, match=str(tmp_path / "nowhere")):
        open_store(f"sqlite:///{path}")


def test_unwritable_file_is_unavailable(tmp_path: Path) -> None:
    directory = tmp_path / "dir.db"
    directory.mkdir()
    with pytest.raises(StoreUnavailableError, match=str(directory)):
        open_store(f"sqlite:///{directory}")


def test_locked_store_names_path_and_cause(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    store = open_store(f"sqlite:///{path}?busy_timeout_ms=100")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailableError, match=r"locked.*busy timeout \(100 ms\)") as info:
            store.transact(lambda t: t.set(("k",), b"v"))
        assert str(path) in str(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.transact(lambda t: t.set(("k",), b"v"))
    store.close()


def test_garbage_file_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an sqlite database at all" * 200)
    with pytest.raises(StoreCorruptError, match=str(path)):
        open_store(f"sqlite:///{path}")


def test_damaged_pages_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    store = open_store(f"sqlite:///{path}")
    store.transact(lambda t: [t.set(("k", i), b"v" * 500) for i in range(2000)])
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    data[2 * page :] = b"\xa5" * (len(data) - 2 * page)
    path.write_bytes(bytes(data))
    reopened = open_store(f"sqlite:///{path}")
    with pytest.raises(StoreCorruptError, match="corrupted"):
        reopened.transact(lambda t: t.get_range_startswith(("k",)))


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorruptError, match="not a millstream store"):
        open_store(f"sqlite:///{path}")


def test_missing_cluster_file(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match=r"cluster file .* does not exist"):
        open_store(f"fdb://{tmp_path / 'absent.cluster'}")


class _ScriptedConnection:
    """Answers statements with SQLITE_BUSY as scripted, as SQLite does (without calling
    its busy handler) while the last connection of a WAL database closes."""

    def __init__(self, busy: list[bool], error: str = "database is locked") -> None:
        self.busy, self.error = iter(busy), error
        self.statements: list[str] = []
        self.in_transaction = False

    def execute(self, statement: str) -> sqlite3.Cursor:
        self.statements.append(statement)
        if statement == "ROLLBACK":
            self.in_transaction = False
        elif next(self.busy, False):
            raise sqlite3.OperationalError(self.error)
        elif statement.startswith("BEGIN"):
            self.in_transaction = True
        return sqlite3.connect(":memory:").execute("SELECT 1")


def test_an_immediate_busy_at_transaction_start_is_retried_from_the_begin() -> None:
    # BEGIN succeeds, the read that takes the snapshot is answered busy, twice.
    conn = _ScriptedConnection(busy=[False, True, False, True, False, False])
    rows = _begin(conn, ("BEGIN", "SELECT 1"), 1_000)  # type: ignore[arg-type]
    assert rows == [(1,)]
    assert conn.statements == [
        *("BEGIN", "SELECT 1", "ROLLBACK"),
        *("BEGIN", "SELECT 1", "ROLLBACK"),
        *("BEGIN", "SELECT 1"),
    ]
    assert conn.in_transaction


def test_other_errors_at_transaction_start_are_not_retried() -> None:
    conn = _ScriptedConnection(busy=[True], error="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        _begin(conn, ("BEGIN IMMEDIATE",), 1_000)  # type: ignore[arg-type]
    assert conn.statements == ["BEGIN IMMEDIATE"]


def test_busy_past_the_timeout_is_raised() -> None:
    conn = _ScriptedConnection(busy=[True] * 10_000)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _begin(conn, ("BEGIN IMMEDIATE",), 50)  # type: ignore[arg-type]
    assert 3 < len(conn.statements) < 100
