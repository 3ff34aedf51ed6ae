"""The FoundationDB backend, on the official ``foundationdb`` Python binding.

The binding needs the FoundationDB client library ``libfdb_c`` (installed by the
FoundationDB client package, not by pip) and a reachable cluster. The API version is
pinned to :data:`FDB_API_VERSION` and selected once per process in :func:`load_fdb`.

FoundationDB's client runs one network thread per process, which does not survive
``fork``: worker processes must open their store themselves (millstream's runners start
them with the ``spawn`` method), never inherit one.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from millstream.exceptions import (
    CommitUnknownResultError,
    KeyTooLargeError,
    RetryableStoreError,
    StoreConflictError,
    StoreError,
    StoreUnavailableError,
    TransactionTooLargeError,
    TransactionTooOldError,
    ValueTooLargeError,
)
from millstream.state.base import Store, Transaction
from millstream.state.keys import Key
from millstream.state.limits import StoreLimits

FDB_API_VERSION = 730
"""The FoundationDB API version millstream selects (needs libfdb_c 7.3 or newer)."""

DEFAULT_TIMEOUT_MS = 10_000
"""Per-attempt transaction timeout: how long an unreachable cluster blocks an operation."""

DEFAULT_CLUSTER_FILE = "/etc/foundationdb/fdb.cluster"

INSTALL_HINT = (
    "Install the FoundationDB client package for your platform (foundationdb-clients "
    ".deb or .rpm on Linux, the .pkg on macOS, version 7.3 or newer, matching your "
    "cluster) from https://github.com/apple/foundationdb/releases (listed on "
    "https://apple.github.io/foundationdb/downloads.html), or put libfdb_c on the library "
    "search path (LD_LIBRARY_PATH / DYLD_LIBRARY_PATH)."
)

NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_TOO_OLD = 1007
TRANSACTION_TIMED_OUT = 1031
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103

_INT64 = struct.Struct("<q")
_load_lock = threading.Lock()
_loaded_pid: int | None = None


def load_fdb() -> Any:
    """Import the binding with :data:`FDB_API_VERSION` selected; the one place that does.

    Returns:
        The ``fdb`` module, ready for ``fdb.open``.

    Raises:
        StoreUnavailableError: ``libfdb_c`` is missing or too old, or the binding was set
            up in a parent process before a fork.
    """
    global _loaded_pid
    import fdb

    with _load_lock:
        if _loaded_pid is not None and _loaded_pid != os.getpid():
            raise StoreUnavailableError(
                "the FoundationDB client was started in a parent process and does not "
                "survive fork; start worker processes with the 'spawn' start method"
            )
        if not fdb.is_api_version_selected():
            try:
                fdb.api_version(FDB_API_VERSION)
            except Exception as exc:  # the binding raises a bare Exception for a missing lib
                text = str(exc)
                if "Unable to locate" in text or isinstance(exc, OSError):
                    raise StoreUnavailableError(
                        f"FoundationDB client library libfdb_c not found: {text} {INSTALL_HINT}"
                    ) from exc
                raise StoreUnavailableError(
                    f"FoundationDB client library libfdb_c cannot serve API version "
                    f"{FDB_API_VERSION}: {text} {INSTALL_HINT}"
                ) from exc
        _loaded_pid = os.getpid()
    return fdb


def fdb_availability(cluster_file: str | None) -> str | None:
    """Why a FoundationDB cluster cannot be used here, or ``None`` if it can be tried.

    Checks that ``libfdb_c`` loads and that the cluster file exists; does not connect.
    """
    path = cluster_file or os.environ.get("FDB_CLUSTER_FILE") or DEFAULT_CLUSTER_FILE
    try:
        load_fdb()
    except StoreUnavailableError as exc:
        return str(exc)
    if not os.path.isfile(path):
        return f"FoundationDB cluster file {path} does not exist"
    return None


def map_fdb_error(fdb: Any, exc: Any, where: str) -> StoreError:
    """Translate an ``fdb.FDBError`` into millstream's store errors."""
    code = int(exc.code)
    text = f"FoundationDB error {code} ({exc.description!r}) on {where}"
    if code == NOT_COMMITTED:
        return StoreConflictError(
            f"{text}: another transaction changed what this one read; retry it"
        )
    if code == COMMIT_UNKNOWN_RESULT:
        return CommitUnknownResultError(
            f"{text}: the commit may or may not have been applied; retry only idempotent "
            "transactions"
        )
    if code == TRANSACTION_TOO_OLD:
        return TransactionTooOldError(
            f"{text}: the transaction ran longer than five seconds; do less work per "
            "transaction (lower the reducer batch size)"
        )
    if code == TRANSACTION_TIMED_OUT:
        return StoreUnavailableError(
            f"{text}: the cluster did not answer within the timeout; check that it is up and "
            "that the cluster file is current (raise timeout_ms in the URL if it is slow)"
        )
    if code == TRANSACTION_TOO_LARGE:
        return TransactionTooLargeError(
            f"{text}: the transaction exceeds 10 MB; commit more often (lower the reducer "
            "batch size)"
        )
    if code == KEY_TOO_LARGE:
        return KeyTooLargeError(f"{text}: a key exceeds 10 kB; use shorter key elements")
    if code == VALUE_TOO_LARGE:
        return ValueTooLargeError(f"{text}: a value exceeds 100 kB; split it over keys")
    if fdb.predicates.is_retryable(exc):
        return RetryableStoreError(f"{text} (transient; retry)")
    return StoreError(text)


class FdbTransaction(Transaction):
    """A transaction on a :class:`FdbStore`: a thin layer over ``fdb.Transaction``."""

    def __init__(self, store: FdbStore) -> None:
        super().__init__(store)
        self._fdb = store.fdb
        self._tr = store.database.create_transaction()

    @contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        try:
            yield
        except self._fdb.FDBError as exc:
            raise map_fdb_error(self._fdb, exc, where) from exc

    def _source(self, snapshot: bool) -> Any:
        return self._tr.snapshot if snapshot else self._tr

    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None:
        with self._errors("get"):
            value: bytes | None = self._source(snapshot).get(key).wait().value
            return value

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        source = self._source(snapshot)
        with self._errors("get_many"):
            futures = [source.get(k) for k in keys]
            return [f.wait().value for f in futures]

    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]:
        with self._errors("get_range"):
            rows = self._source(snapshot).get_range(
                begin,
                end,
                limit=limit,
                reverse=reverse,
                streaming_mode=self._fdb.StreamingMode.want_all,
            )
            return [(kv.key, kv.value) for kv in rows]

    def _raw_set(self, key: bytes, value: bytes) -> None:
        with self._errors("set"):
            self._tr.set(key, value)

    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None:
        with self._errors("set_many"):
            set_ = self._tr.set
            for k, v in zip(keys, values, strict=True):
                set_(k, v)

    def _raw_clear(self, key: bytes) -> None:
        with self._errors("clear"):
            self._tr.clear(key)

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        with self._errors("clear_range"):
            self._tr.clear_range(begin, end)

    def _raw_add(self, key: bytes, delta: int) -> None:
        with self._errors("add"):
            self._tr.add(key, _INT64.pack(delta))

    def _raw_add_many(self, keys: list[bytes], deltas: list[int]) -> None:
        with self._errors("add_many"):
            add = self._tr.add
            pack = _INT64.pack
            for k, d in zip(keys, deltas, strict=True):
                add(k, pack(d))

    def _raw_commit(self) -> None:
        with self._errors("commit"):
            self._tr.commit().wait()

    def _raw_reset(self) -> None:
        self._tr.reset()


class FdbStore(Store):
    """A store on a FoundationDB cluster.

    Open it with ``open_store("fdb://")`` (the default cluster file: ``$FDB_CLUSTER_FILE``,
    then ``./fdb.cluster``, then ``/etc/foundationdb/fdb.cluster``) or
    ``open_store("fdb:///path/to/fdb.cluster")``. Opening checks that the cluster answers.
    """

    def __init__(
        self,
        url: str,
        cluster_file: str | None,
        prefix: Key = (),
        limits: StoreLimits | None = None,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        super().__init__(url, prefix, limits)
        self._cluster_file = cluster_file
        where = cluster_file or "the default cluster file"
        if cluster_file is not None and not os.path.isfile(cluster_file):
            raise StoreUnavailableError(
                f"FoundationDB cluster file {cluster_file} does not exist; copy it from a "
                "cluster machine (/etc/foundationdb/fdb.cluster) or fix the store URL"
            )
        self._fdb = load_fdb()
        self._pid = os.getpid()
        try:
            self._db = self._fdb.open(cluster_file)
            if timeout_ms:
                self._db.options.set_transaction_timeout(timeout_ms)
            probe = self._db.create_transaction()
            probe.get_read_version().wait()
        except self._fdb.FDBError as exc:
            raise StoreUnavailableError(
                f"FoundationDB cluster ({where}) is unreachable: {exc}. Check that the "
                "cluster is up (fdbcli --exec status) and that the cluster file is current."
            ) from exc

    @property
    def fdb(self) -> Any:
        """The ``fdb`` module (API version selected)."""
        return self._fdb

    @property
    def database(self) -> Any:
        """The ``fdb.Database``."""
        if self._pid != os.getpid():
            raise StoreUnavailableError(
                "a FoundationDB store cannot be used across fork; reopen it in the child "
                "(pickle the store: it reopens from its URL) under the 'spawn' start method"
            )
        return self._db

    def create_transaction(self) -> FdbTransaction:
        """Start a transaction."""
        return FdbTransaction(self)

    def close(self) -> None:
        """Nothing to release: the binding keeps one connection per cluster file."""


__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "FDB_API_VERSION",
    "FdbStore",
    "FdbTransaction",
    "fdb_availability",
    "load_fdb",
    "map_fdb_error",
]
