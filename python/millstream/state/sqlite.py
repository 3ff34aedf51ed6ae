"""The embedded store: one SQLite file in WAL mode, safe across the processes of one host.

Concurrency follows FoundationDB's optimistic model at key granularity. Reads run in a
deferred read transaction (one consistent snapshot); writes are buffered in Python, where
reads see them. ``commit`` ends the read transaction, takes the write lock
(``BEGIN IMMEDIATE``), re-reads every key and range the transaction read without
``snapshot=True`` and fails with :class:`StoreConflictError` if any of them changed, else
applies the buffered writes and commits. The write lock is held only for the commit, so
transactions on disjoint keys (two reducers, a mapper's state write) never conflict, and
the result is serializable: a committed transaction behaves as if it ran entirely at its
commit.

Values are BLOBs, except that atomic-add results are stored as SQLite INTEGERs so that the
add runs in SQL without a Python call per key; reads turn them back into 8-byte
little-endian bytes, so callers always see FoundationDB's representation.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from millstream.exceptions import (
    StoreConflictError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from millstream.state.base import Store, StoreTransaction
from millstream.state.keys import Key, decode_int64, wrap_int64
from millstream.state.limits import StoreLimits

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
that clean-up with SQLITE_BUSY without waiting; :func:`_begin` retries those.
"""

SCHEMA_VERSION = 1

DEFAULT_BUSY_TIMEOUT_MS = 10_000
"""How long a commit waits for another process's commit before the store counts as locked."""


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite answered that the store is locked (worth waiting and retrying)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(exc)


_POLL_FIRST_SECONDS = 0.000_2
_POLL_MAX_SECONDS = 0.002
"""How often a transaction that waits for the lock tries again: from 0.2 ms, doubling, to
2 ms (see :func:`_begin`)."""


def _begin(conn: sqlite3.Connection, statements: tuple[str, ...], timeout_ms: int) -> list[Any]:
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
    pause = _POLL_FIRST_SECONDS
    while True:
        try:
            rows: list[Any] = []
            for statement in statements:
                rows = conn.execute(statement).fetchall()
            return rows
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not _is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_SECONDS)


_INT64 = struct.Struct("<q")
_IN_CHUNK = 500

_SQL_GET = "SELECT value FROM kv WHERE key = ?"
_SQL_START_READ = "SELECT 1 FROM kv LIMIT 1"
"""Any read of the table: in a deferred transaction it takes the snapshot."""
_SQL_SET = (
    "INSERT INTO kv(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
_SQL_CLEAR = "DELETE FROM kv WHERE key = ?"
_SQL_CLEAR_RANGE = "DELETE FROM kv WHERE key >= ? AND key < ?"
_SQL_ADD = (
    "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = CASE "
    "WHEN typeof(value) = 'integer' AND ((?2 >= 0 AND value <= 9223372036854775807 - ?2) "
    "OR (?2 < 0 AND value >= (-9223372036854775807 - 1) - ?2)) THEN value + ?2 "
    "ELSE ms_add(value, ?2) END"
)

_SET, _CLEAR, _ADD = 0, 1, 2


def _norm(value: Any) -> bytes:
    """A stored value as bytes (INTEGERs are atomic-add results)."""
    if type(value) is bytes:
        return value
    if type(value) is int:
        return _INT64.pack(value)
    raise StoreCorruptError(f"unexpected value of type {type(value).__name__} in the store")


def _add_bytes(base: bytes | None, delta: int) -> bytes:
    return _INT64.pack(wrap_int64((decode_int64(base) if base else 0) + delta))


def _sql_add(value: Any, delta: int) -> int:
    """SQL function ``ms_add``: FoundationDB ADD on a stored value; returns an INTEGER."""
    base = 0 if value is None else decode_int64(_norm(value))
    return wrap_int64(base + delta)


# -- the write buffer -------------------------------------------------------------------


@dataclass
class _PointOps:
    """Consecutive single-key writes, composed per key: kind is _SET, _CLEAR or _ADD."""

    ops: dict[bytes, tuple[int, Any]] = field(default_factory=dict)


@dataclass
class _ClearRange:
    begin: bytes
    end: bytes


@dataclass
class _BatchSet:
    keys: list[bytes]
    values: list[bytes]
    _index: dict[bytes, bytes] | None = None

    def index(self) -> dict[bytes, bytes]:
        if self._index is None:
            self._index = dict(zip(self.keys, self.values, strict=True))
        return self._index


@dataclass
class _BatchAdd:
    keys: list[bytes]
    deltas: list[int]
    _index: dict[bytes, int] | None = None

    def index(self) -> dict[bytes, int]:
        if self._index is None:
            index = dict(zip(self.keys, self.deltas, strict=True))
            if len(index) != len(self.keys):
                index = {}
                for k, d in zip(self.keys, self.deltas, strict=True):
                    index[k] = index.get(k, 0) + d
            self._index = index
        return self._index


_Op = _PointOps | _ClearRange | _BatchSet | _BatchAdd


def _compose(prev: tuple[int, Any] | None, kind: int, payload: Any) -> tuple[int, Any]:
    """A point write followed by another on the same key, as one write."""
    if kind != _ADD or prev is None:
        return kind, payload
    prev_kind, prev_payload = prev
    if prev_kind == _SET:
        return _SET, _add_bytes(prev_payload, payload)
    if prev_kind == _CLEAR:
        return _SET, _add_bytes(None, payload)
    return _ADD, wrap_int64(prev_payload + payload)


def map_sqlite_error(exc: sqlite3.Error, path: str, busy_timeout_ms: int) -> StoreError:
    """Translate a sqlite3 error into millstream's store errors."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if _is_busy(exc):
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


class SqliteTransaction(StoreTransaction):
    """A transaction on a :class:`SqliteStore` (see the module docstring for the model)."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self._sqlite = store
        self._conn: sqlite3.Connection | None = None
        self._log: list[_Op] = []
        self._reads: dict[bytes, bytes | None] = {}
        self._ranges: list[tuple[bytes, bytes, bool, bytes]] = []

    # -- connection ---------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = self._sqlite.checkout()
            try:
                # Start the snapshot now: a busy answer is retried here, not on a later read.
                _begin(conn, ("BEGIN", _SQL_START_READ), self._sqlite.busy_timeout_ms)
            except sqlite3.Error as exc:
                self._sqlite.release(conn)
                raise self._sqlite.error(exc) from exc
            self._conn = conn
        return self._conn

    def _release(self, rollback: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK" if rollback else "COMMIT")
            except sqlite3.Error:
                conn.close()
                return
        self._sqlite.release(conn)

    # -- read-your-writes ---------------------------------------------------------------

    def _buffered(self, key: bytes) -> tuple[bool, bytes | None, int | None]:
        """Resolve ``key`` against the write buffer.

        Returns ``(resolved, value, pending_add)``: when ``resolved`` is false the stored
        value is needed, plus ``pending_add`` if not None.
        """
        pending: int | None = None
        for op in reversed(self._log):
            if isinstance(op, _PointOps):
                entry = op.ops.get(key)
                if entry is None:
                    continue
                kind, payload = entry
                if kind == _ADD:
                    pending = payload if pending is None else pending + payload
                    continue
                base = payload if kind == _SET else None
            elif isinstance(op, _ClearRange):
                if not op.begin <= key < op.end:
                    continue
                base = None
            elif isinstance(op, _BatchSet):
                value = op.index().get(key)
                if value is None:
                    continue
                base = value
            else:
                delta = op.index().get(key)
                if delta is None:
                    continue
                pending = delta if pending is None else pending + delta
                continue
            if pending is None:
                return True, base, None
            return True, _add_bytes(base, pending), None
        return False, None, pending

    def _overlay(self, begin: bytes, end: bytes) -> dict[bytes, bytes | None]:
        """Buffered keys in ``[begin, end)`` with their read-your-writes values."""
        keys: set[bytes] = set()
        for op in self._log:
            if isinstance(op, _PointOps):
                candidates: Iterable[bytes] = op.ops
            elif isinstance(op, _BatchSet | _BatchAdd):
                candidates = op.index()
            else:
                continue
            keys.update(k for k in candidates if begin <= k < end)
        return {k: self._resolve(k) for k in keys}

    def _cleared(self, begin: bytes, end: bytes) -> list[_ClearRange]:
        return [
            op
            for op in self._log
            if isinstance(op, _ClearRange) and op.begin < end and begin < op.end
        ]

    def _resolve(self, key: bytes, snapshot: bool = False) -> bytes | None:
        resolved, value, pending = self._buffered(key)
        if resolved:
            return value
        stored = self._db_get(key, snapshot)
        return stored if pending is None else _add_bytes(stored, pending)

    def _db_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if not snapshot and key in self._reads:
            return self._reads[key]
        conn = self._reader()
        try:
            row = conn.execute(_SQL_GET, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        value = None if row is None else _norm(row[0])
        if not snapshot:
            self._reads[key] = value
        return value

    # -- raw reads ----------------------------------------------------------------------

    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if not self._log:
            return self._db_get(key, snapshot)
        return self._resolve(key, snapshot)

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        if not self._log:
            found = self._fetch_many(self._reader(), keys)
            values = [found.get(k) for k in keys]
            if not snapshot:
                self._reads.update(zip(keys, values, strict=True))
            return values
        buffered = [self._buffered(k) for k in keys]
        needed = [k for k, (resolved, _, _) in zip(keys, buffered, strict=True) if not resolved]
        found = self._fetch_many(self._reader(), needed)
        if not snapshot:
            self._reads.update((k, found.get(k)) for k in needed)
        out: list[bytes | None] = []
        for k, (resolved, value, pending) in zip(keys, buffered, strict=True):
            if resolved:
                out.append(value)
            else:
                stored = found.get(k)
                out.append(stored if pending is None else _add_bytes(stored, pending))
        return out

    def _fetch_many(self, conn: sqlite3.Connection, keys: list[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        unique = list(dict.fromkeys(keys))
        try:
            for start in range(0, len(unique), _IN_CHUNK):
                chunk = unique[start : start + _IN_CHUNK]
                sql = f"SELECT key, value FROM kv WHERE key IN ({','.join('?' * len(chunk))})"
                for k, v in conn.execute(sql, chunk):
                    found[k] = _norm(v)
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        return found

    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]:
        conn = self._reader()
        overlay = self._overlay(begin, end) if self._log else {}
        cleared = self._cleared(begin, end) if self._log else []
        order = "DESC" if reverse else "ASC"
        sql = f"SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key {order}"
        params: tuple[Any, ...] = (begin, end)
        if limit and not overlay and not cleared:
            sql += " LIMIT ?"
            params = (begin, end, limit)
        buffered = sorted(overlay.items(), reverse=reverse)
        digest = hashlib.blake2b(digest_size=16)
        out: list[tuple[bytes, bytes]] = []
        full = False
        bi = 0

        def before(a: bytes, b: bytes) -> bool:
            return a > b if reverse else a < b

        try:
            rows: Iterator[tuple[bytes, Any]] = iter(conn.execute(sql, params))
            for k, raw in rows:
                while bi < len(buffered) and before(buffered[bi][0], k):
                    bk, bv = buffered[bi]
                    bi += 1
                    if bv is not None:
                        out.append((bk, bv))
                        if limit and len(out) >= limit:
                            full = True
                            break
                if full:
                    break
                v = _norm(raw)
                digest.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
                if k in overlay or any(c.begin <= k < c.end for c in cleared):
                    continue
                out.append((k, v))
                if limit and len(out) >= limit:
                    full = True
                    break
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        if not full:
            for bk, bv in buffered[bi:]:
                if bv is not None:
                    out.append((bk, bv))
                    if limit and len(out) >= limit:
                        full = True
                        break
        if not snapshot:
            if full and not reverse:
                self._ranges.append((begin, out[-1][0] + b"\x00", reverse, digest.digest()))
            elif full:
                self._ranges.append((out[-1][0], end, reverse, digest.digest()))
            else:
                self._ranges.append((begin, end, reverse, digest.digest()))
        return out

    # -- raw writes ---------------------------------------------------------------------

    def _point(self, key: bytes, kind: int, payload: Any) -> None:
        last = self._log[-1] if self._log else None
        if not isinstance(last, _PointOps):
            last = _PointOps()
            self._log.append(last)
        last.ops[key] = _compose(last.ops.get(key), kind, payload)

    def _raw_set(self, key: bytes, value: bytes) -> None:
        self._point(key, _SET, value)

    def _raw_clear(self, key: bytes) -> None:
        self._point(key, _CLEAR, None)

    def _raw_add(self, key: bytes, delta: int) -> None:
        self._point(key, _ADD, delta)

    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None:
        if keys:
            self._log.append(_BatchSet(keys, values))

    def _raw_add_many(self, keys: list[bytes], deltas: list[int]) -> None:
        if keys:
            self._log.append(_BatchAdd(keys, deltas))

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        self._log.append(_ClearRange(begin, end))

    # -- commit -------------------------------------------------------------------------

    def _validate(self, conn: sqlite3.Connection) -> None:
        if self._reads:
            current = self._fetch_many(conn, list(self._reads))
            for key, seen in self._reads.items():
                if current.get(key) != seen:
                    raise StoreConflictError(
                        f"key {key[:64]!r} changed after this transaction read it; retry "
                        "the transaction (Store.transact does so)"
                    )
        for begin, end, reverse, seen_digest in self._ranges:
            digest = hashlib.blake2b(digest_size=16)
            order = "DESC" if reverse else "ASC"
            sql = f"SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key {order}"
            for k, raw in conn.execute(sql, (begin, end)):
                v = _norm(raw)
                digest.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(4, "little") + v)
            if digest.digest() != seen_digest:
                raise StoreConflictError(
                    f"keys in [{begin[:64]!r}, {end[:64]!r}) changed after this transaction "
                    "read them; retry the transaction (Store.transact does so)"
                )

    def _apply(self, conn: sqlite3.Connection) -> None:
        for op in self._log:
            if isinstance(op, _PointOps):
                sets = [(k, p) for k, (kind, p) in op.ops.items() if kind == _SET]
                clears = [(k,) for k, (kind, _) in op.ops.items() if kind == _CLEAR]
                adds = [(k, p) for k, (kind, p) in op.ops.items() if kind == _ADD]
                if clears:
                    conn.executemany(_SQL_CLEAR, clears)
                if sets:
                    conn.executemany(_SQL_SET, sets)
                if adds:
                    conn.executemany(_SQL_ADD, adds)
            elif isinstance(op, _ClearRange):
                conn.execute(_SQL_CLEAR_RANGE, (op.begin, op.end))
            elif isinstance(op, _BatchSet):
                conn.executemany(_SQL_SET, zip(op.keys, op.values, strict=True))
            else:
                conn.executemany(_SQL_ADD, zip(op.keys, op.deltas, strict=True))

    def _raw_commit(self) -> None:
        if not self._log:
            self._release(rollback=False)
            self._clear_state()
            return
        if self._conn is not None:
            self._release(rollback=False)
        conn = self._sqlite.checkout()
        try:
            _begin(conn, ("BEGIN IMMEDIATE",), self._sqlite.busy_timeout_ms)
            try:
                self._validate(conn)
                self._apply(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        finally:
            self._sqlite.release(conn)
            self._clear_state()

    def _clear_state(self) -> None:
        self._log = []
        self._reads = {}
        self._ranges = []

    def _raw_reset(self) -> None:
        self._release(rollback=True)
        self._clear_state()


class SqliteStore(Store):
    """The embedded store on one SQLite file (see the module docstring).

    Open it with ``open_store("sqlite:///abs/path/file.db")``. Connections are pooled and
    handed to one transaction at a time, so threads share a store safely; after a fork the
    child opens its own connections. ``clock`` (monotonic seconds, default the real clock)
    times transactions against the five-second limit; simulations pass their own.
    """

    def __init__(
        self,
        url: str,
        path: str,
        prefix: Key = (),
        limits: StoreLimits | None = None,
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        synchronous: str = "FULL",
        checkpoint_pages: int = DEFAULT_CHECKPOINT_PAGES,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(url, prefix, limits)
        if clock is not None:
            self.clock = clock
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._checkpoint_pages = checkpoint_pages
        self._lock = threading.Lock()
        self._pool: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        self._initialize()

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    @property
    def busy_timeout_ms(self) -> int:
        """How long a transaction waits to start while another connection holds a lock."""
        return self._busy_timeout_ms

    def error(self, exc: sqlite3.Error) -> StoreError:
        """The millstream error for a sqlite3 error on this store."""
        return map_sqlite_error(exc, self._path, self._busy_timeout_ms)

    def _connect(self) -> sqlite3.Connection:
        directory = os.path.dirname(self._path) or "."
        if not os.path.isdir(directory):
            raise StoreUnavailableError(
                f"cannot open SQLite store {self._path}: directory {directory} does not exist"
            )
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=0,  # every wait is in _begin
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
            )
        except sqlite3.Error as exc:
            raise self.error(exc) from exc
        try:
            # The first statement reads the schema, which can find the store busy.
            settings = (
                "PRAGMA busy_timeout = 0",
                f"PRAGMA synchronous = {self._synchronous}",
                "PRAGMA cache_size = -32768",
                f"PRAGMA wal_autocheckpoint = {int(self._checkpoint_pages)}",
            )
            _begin(conn, settings, self._busy_timeout_ms)
            conn.create_function("ms_add", 2, _sql_add, deterministic=True)
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc) from exc
        return conn

    def _initialize(self) -> None:
        conn = self._connect()

        def query(sql: str) -> list[Any]:
            return _begin(conn, (sql,), self._busy_timeout_ms)

        try:
            app_id = query("PRAGMA application_id")[0][0]
            tables = {
                row[0] for row in query("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables - {"kv"}):
                raise StoreCorruptError(
                    f"{self._path} is an SQLite database but not a millstream store "
                    f"(application_id {app_id:#x}, tables {sorted(tables)}). Point the store "
                    "URL at a new file."
                )
            if query("PRAGMA journal_mode")[0][0].lower() != "wal":
                mode = query("PRAGMA journal_mode = WAL")[0][0]
                if mode.lower() != "wal":
                    raise StoreUnavailableError(
                        f"SQLite store {self._path} cannot use WAL mode (got {mode}); put it "
                        "on a local file system"
                    )
            if app_id == 0:
                _begin(conn, ("BEGIN IMMEDIATE",), self._busy_timeout_ms)
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY NOT NULL, "
                    "value NOT NULL) WITHOUT ROWID"
                )
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            else:
                version = query("PRAGMA user_version")[0][0]
                if version != SCHEMA_VERSION or "kv" not in tables:
                    raise StoreCorruptError(
                        f"SQLite store {self._path} has schema version {version}, expected "
                        f"{SCHEMA_VERSION}; it was written by another millstream version"
                    )
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc) from exc
        except BaseException:
            conn.close()
            raise
        self._pool.append(conn)

    def checkout(self) -> sqlite3.Connection:
        """Take a connection from the pool (or open one)."""
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(f"SQLite store {self._path} is closed")
            if self._pid != os.getpid():
                _inherited.extend(self._pool)
                self._pool = []
                self._pid = os.getpid()
            if self._pool:
                return self._pool.pop()
        return self._connect()

    def release(self, conn: sqlite3.Connection) -> None:
        """Return a connection to the pool."""
        with self._lock:
            if self._pid != os.getpid():
                _inherited.append(conn)
                return
            if self._closed or conn.in_transaction or len(self._pool) >= 8:
                conn.close()
                return
            self._pool.append(conn)

    def create_transaction(self) -> SqliteTransaction:
        """Start a transaction."""
        if self._closed:
            raise StoreUnavailableError(f"SQLite store {self._path} is closed")
        return SqliteTransaction(self)

    def close(self) -> None:
        """Close pooled connections; transactions still open keep theirs until they end."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        if self._pid == os.getpid():
            for conn in pool:
                conn.close()


_inherited: list[sqlite3.Connection] = []
"""Connections inherited through fork: kept open and unused (closing them is unsafe)."""


__all__ = ["APPLICATION_ID", "DEFAULT_BUSY_TIMEOUT_MS", "SqliteStore", "SqliteTransaction"]
