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

from millstream.state.sqlite.sql import (
    APPLICATION_ID,
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_CHECKPOINT_PAGES,
    SCHEMA_VERSION,
    SECURE_DELETE,
    map_sqlite_error,
)
from millstream.state.sqlite.store import SqliteStore
from millstream.state.sqlite.transaction import SqliteTransaction

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "DEFAULT_CHECKPOINT_PAGES",
    "SCHEMA_VERSION",
    "SECURE_DELETE",
    "SqliteStore",
    "SqliteTransaction",
    "map_sqlite_error",
]
