"""The SQL of the embedded store: statements, value encoding, ``BEGIN`` with retries on
SQLITE_BUSY, and the mapping of SQLite errors to the store's."""

from __future__ import annotations

import sqlite3
import struct
import time
from typing import Any

from millstream.exceptions import (
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from millstream.state.keys import add_int64s, decode_int64, wrap_int64

APPLICATION_ID = 0x4D534D31
"""``PRAGMA application_id`` of a millstream store file ('MSM1')."""

DEFAULT_CHECKPOINT_PAGES = 16_384
"""WAL pages (4 KiB, so 64 MiB of log) after which a commit copies the log into the database
file.

SQLite's default is 1,000 pages: a store whose hot keys fill a few MB is then copied back
into the file after nearly every reducer commit, doubling the bytes written. With 16,384 a
page that many commits rewrite is copied once (measured on the 20 M-row keyed sum: 0.040
bytes written per input byte with 1,000 pages, 0.019 with 16,384). Set it per store with
``checkpoint_pages=N`` in the URL.

A longer log makes the last connection's close (which checkpoints the whole log and
deletes it) take longer, and SQLite answers a connection that starts a transaction during
that clean-up with SQLITE_BUSY without waiting; :func:`begin_transaction` retries those.
"""

SQL_CREATE_KV = "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY NOT NULL, value NOT NULL)"
"""The key-value table: a rowid table with an index on the key.

Not ``WITHOUT ROWID``, although every read goes by key: in a ``WITHOUT ROWID`` table the
whole row is the b-tree's key, so its interior pages hold whole rows as dividers, and a
search that compares with a divider whose value overflows reads every overflow page of that
value first. Large values (a queue's chunks, spilled rows) then made a point read of a
small key read hundreds of pages: after another connection's commit, four small keys read
together took 369 us beside a queue's chunks, against 53 us in this layout, and a small
write transaction 473 against 248 us. Here the index holds keys and rowids only, and a
value's pages are read when that value is. Stores created before keep their ``WITHOUT
ROWID`` table, which the same statements read and write.
"""

SCHEMA_VERSION = 5
"""1: the key-value table; 2: and the delta runs (:mod:`millstream.state.sqlite.runs`);
3: runs stored as one compressed stream (runs of version 2 read as they are); 4: runs carry
a generation (runs of earlier versions have none); 5: the runs table's data is its last
column (:data:`~millstream.state.sqlite.runs.RUNS_COLUMNS` says why)."""

SECURE_DELETE = ("FAST", "ON", "OFF")
"""Values of SQLite's ``secure_delete`` (the first is the store's default): FAST zeroes
deleted content only on pages a commit writes anyway. Builds with
``SQLITE_SECURE_DELETE`` (Debian's, Ubuntu's) default to ON, which writes every freed page
again as zeros: each trimmed queue row and merged run a second time, to the log and then
to the file."""

DEFAULT_BUSY_TIMEOUT_MS = 10_000
"""How long a commit waits for another process's commit before the store counts as locked."""


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite answered that the store is locked (worth waiting and retrying)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


POLL_FIRST_SECONDS = 0.000_2
POLL_MAX_SECONDS = 0.002
"""How often a transaction that waits for the lock tries again: from 0.2 ms, doubling, to
2 ms (see :func:`begin_transaction`)."""


def begin_transaction(
    conn: sqlite3.Connection, statements: tuple[str, ...], timeout_ms: int
) -> list[Any]:
    """Run ``statements`` (those that start a transaction), waiting while the store is busy.

    Every wait for a lock happens here, not in SQLite's busy handler (connections have a
    busy timeout of 0), for two reasons:

    - Latency. SQLite's handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, then 100
      ms between tries, so a writer queued behind a few commits (producers, mappers,
      reducers and heartbeats all write) can sleep up to 100 ms after the lock was free;
      measured, that set the p99 of append-to-commit latency. Here a waiter tries again
      every 0.2-2 ms.
    - Not every busy answer goes through the handler: while the last connection to a WAL
      database closes (it checkpoints and deletes the log under an exclusive lock) or a
      connection recovers the log after a crash, others get SQLITE_BUSY at once
      (https://sqlite.org/wal.html, "Sometimes Queries Return SQLITE_BUSY In WAL Mode").

    Nothing was read or written yet when these statements fail, so retrying is safe. Gives
    up after ``timeout_ms`` in all and raises the last error. Returns the rows of the last
    statement.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    pause = POLL_FIRST_SECONDS
    while True:
        try:
            rows: list[Any] = []
            for statement in statements:
                rows = conn.execute(statement).fetchall()
            return rows
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_SECONDS)


INT64 = struct.Struct("<q")
IN_CHUNK = 500
FEW_KEYS = 4
"""Batch reads of at most this many keys read them one by one (a cached one-key statement
each), not as one ``IN`` query."""

SQL_GET = "SELECT value FROM kv WHERE key = ?"
SQL_SET = (
    "INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
SQL_CLEAR = "DELETE FROM kv WHERE key = ?"
SQL_CLEAR_RANGE = "DELETE FROM kv WHERE key >= ? AND key < ?"
SQL_ADD = (
    "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = CASE "
    "WHEN typeof(value) = 'integer' AND ((?2 >= 0 AND value <= 9223372036854775807 - ?2) "
    "OR (?2 < 0 AND value >= (-9223372036854775807 - 1) - ?2)) THEN value + ?2 "
    "ELSE ms_add(value, ?2) END"
)

SQL_ADD_LANES = (
    "INSERT INTO kv(key, value) VALUES (?1, ?2) "
    "ON CONFLICT(key) DO UPDATE SET value = ms_add_lanes(value, ?2)"
)


def norm(value: Any) -> bytes:
    """A stored value as bytes (INTEGERs are atomic-add results)."""
    if type(value) is bytes:
        return value
    if type(value) is int:
        return INT64.pack(value)
    raise StoreCorruptError(f"unexpected value of type {type(value).__name__} in the store")


def sql_add(value: Any, delta: int) -> int:
    """SQL function ``ms_add``: FoundationDB ADD on a stored value; returns an INTEGER."""
    base = 0 if value is None else decode_int64(norm(value))
    return wrap_int64(base + delta)


def sql_add_lanes(value: Any, delta: bytes) -> bytes:
    """SQL function ``ms_add_lanes``: a vector add (int64 lanes) on a stored value."""
    return add_int64s(None if value is None else norm(value), delta)


def map_sqlite_error(exc: sqlite3.Error, path: str, busy_timeout_ms: int) -> StoreError:
    """Translate a sqlite3 error into millstream's store errors."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if is_busy(exc):
        return StoreUnavailableError(
            f"SQLite store {path} is locked: another process held its write lock for longer "
            f"than the busy timeout ({busy_timeout_ms} ms) ({text}). Check for a stuck "
            "process using the file, or raise busy_timeout_ms in the store URL."
        )
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text:
        return StoreCorruptError(
            f"SQLite store {path} is corrupted or not a database ({text}). Restore it from a "
            "backup or delete it to start over (the processor then starts from scratch)."
        )
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_FULL")):
        return StoreUnavailableError(
            f"cannot use SQLite store {path}: {text}. Check that the directory exists, is "
            "writable and has free space."
        )
    if isinstance(exc, sqlite3.OperationalError) and "unable to open" in text:
        return StoreUnavailableError(f"cannot open SQLite store {path}: {text}")
    return StoreError(f"SQLite store {path}: {text}")
