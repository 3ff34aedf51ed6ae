"""The embedded store: one SQLite file in WAL mode and a pool of connections."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from millstream.exceptions import (
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from millstream.state.keys import Key, pack
from millstream.state.limits import StoreLimits
from millstream.state.sqlite.run_cache import RunCache
from millstream.state.sqlite.run_merge import MergeLock, RunMerger, merge_runs
from millstream.state.sqlite.runs import (
    DEFAULT_RUN_MIN_KEYS,
    SQL_CREATE_RUNS,
    upgrade_runs_table,
)
from millstream.state.sqlite.sql import (
    APPLICATION_ID,
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_CHECKPOINT_PAGES,
    SCHEMA_VERSION,
    SECURE_DELETE,
    SQL_CREATE_KV,
    begin_transaction,
    map_sqlite_error,
    sql_add,
    sql_add_lanes,
)
from millstream.state.sqlite.transaction import SqliteTransaction
from millstream.state.sqlite.wakeups import Wakeups
from millstream.state.store import Store

log = logging.getLogger(__name__)


class SqliteStore(Store):
    """The embedded store on one SQLite file (see the module docstring).

    Open it with ``open_store("sqlite:///abs/path/file.db")``. Connections are pooled and
    handed to one transaction at a time, so threads share a store safely; after a fork the
    child opens its own connections. ``clock`` (monotonic seconds, default the real clock)
    times transactions against the five-second limit; simulations pass their own.
    ``connection_factory`` (a :class:`sqlite3.Connection` subclass) opens every connection:
    the seam through which fault tests fail the backend's own statements.
    """

    limits_transaction_size = False

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
        run_min_keys: int = DEFAULT_RUN_MIN_KEYS,
        secure_delete: str = SECURE_DELETE[0],
        clock: Callable[[], float] | None = None,
        connection_factory: type[sqlite3.Connection] = sqlite3.Connection,
    ) -> None:
        super().__init__(url, prefix, limits)
        self._connection_factory = connection_factory
        if clock is not None:
            self.clock = clock
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._checkpoint_pages = checkpoint_pages
        self._secure_delete = secure_delete
        """SQLite's ``secure_delete`` (see :data:`~millstream.state.sqlite.sql.SECURE_DELETE`)."""
        self.run_min_keys = run_min_keys
        """Keys an ``add_many`` needs to be stored as a delta run (0: never)."""
        self.run_cache = RunCache()
        self.merge_lock = MergeLock(path + "-merge")
        """Taken by the process that merges runs (one at a time)."""
        self.merger = RunMerger(self._merge_runs)
        """Merges runs after the commits that made merges due."""
        self.wakeups = Wakeups(path + "-watch", database=path)
        """Waiters of keys (:meth:`wait_for`) and the wakes of committed writes."""
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
                timeout=0,  # every wait is in begin
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
                factory=self._connection_factory,
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
                f"PRAGMA secure_delete = {self._secure_delete}",
            )
            begin_transaction(conn, settings, self._busy_timeout_ms)
            conn.create_function("ms_add", 2, sql_add, deterministic=True)
            conn.create_function("ms_add_lanes", 2, sql_add_lanes, deterministic=True)
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc) from exc
        return conn

    def _initialize(self) -> None:
        conn = self._connect()

        def query(*statements: str) -> list[Any]:
            return begin_transaction(conn, statements, self._busy_timeout_ms)

        try:
            # One snapshot for both: a process creating the store meanwhile must not show
            # its tables beside the application id read before it committed them.
            app_id = query("BEGIN", "PRAGMA application_id")[0][0]
            try:
                tables = {
                    row[0]
                    for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                }
            finally:
                conn.execute("COMMIT")
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
                begin_transaction(conn, ("BEGIN IMMEDIATE",), self._busy_timeout_ms)
                conn.execute(SQL_CREATE_KV)
                conn.execute(SQL_CREATE_RUNS)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            else:
                version = query("PRAGMA user_version")[0][0]
                if version in (1, 2, 3, 4) and "kv" in tables:
                    # Version 1 had no delta runs: the same store with an empty runs table.
                    # Runs of versions 2 to 4 decode as they are (without a generation before
                    # 4), in a table with today's columns; from now on, a version that
                    # cannot read today's runs refuses the store.
                    begin_transaction(conn, ("BEGIN IMMEDIATE",), self._busy_timeout_ms)
                    upgrade_runs_table(conn, keep_generations=version == 4)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.execute("COMMIT")
                    version = SCHEMA_VERSION
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
                self.run_cache = RunCache()  # its lock may have been held at the fork
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
        self.merger.close()
        if self._pid == os.getpid():
            for conn in pool:
                conn.close()
        self.merge_lock.close()
        self.wakeups.close()

    def wait_for(
        self, key: Key, until: Callable[[bytes | None], bool], timeout_seconds: float
    ) -> None:
        """See :meth:`Store.wait_for`: sleeps on a pipe that commits naming ``key`` wake
        (:mod:`millstream.state.sqlite.wakeups`). The pipe keeps the wakes of commits since
        this thread's last wait for ``key``, so ``until`` is checked only when the pipe is
        new: a caller that read and found nothing wakes at once if a commit followed."""
        pipe, made = self.wakeups.pipe(self.prefix_bytes + pack(key))
        if pipe is None:  # no pipes here: read, then sleep
            super().wait_for(key, until, timeout_seconds)
            return
        if made:  # no wake of an earlier commit is kept: read first
            with self.read() as txn:
                if until(txn.get(key, snapshot=True)):
                    return
        self.wakeups.sleep(pipe, timeout_seconds)

    def _wake(self, keys: set[bytes]) -> None:
        self.wakeups.wake(keys)

    def _merge_runs(self) -> None:
        """One round of run merges (:class:`RunMerger`'s thread). A failure is logged,
        never raised: the commits that made the merge due are done, and the next commit
        that finds a merge due asks again."""
        try:
            conn = self.checkout()
        except StoreUnavailableError:
            return  # closed
        try:
            with self.merge_lock.held() as mine:
                if mine:
                    merge_runs(conn, self.run_cache, self.run_min_keys, self._busy_timeout_ms)
        except Exception as exc:
            log.warning("SQLite store %s: merging delta runs failed: %r", self._path, exc)
            if conn.in_transaction:
                conn.rollback()
        finally:
            self.release(conn)


_inherited: list[sqlite3.Connection] = []
"""Connections inherited through fork: kept open and unused (closing them is unsafe)."""


__all__ = ["SqliteStore"]
