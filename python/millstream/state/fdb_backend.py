"""The FoundationDB backend, on the official ``foundationdb`` Python binding.

The binding needs the FoundationDB client library ``libfdb_c`` (installed by the
FoundationDB client package, not by pip) and a reachable cluster. The API version is
pinned to :data:`FDB_API_VERSION` and selected once per process in :func:`load_fdb`, which
also finds the library: ``$MILLSTREAM_FDB_HOME/lib`` when that is set (a FoundationDB
folder with ``bin/`` and ``lib/``, e.g. one built from source), else the library search
path and the client packages' standard paths (:data:`STANDARD_LIBRARY_PATHS`).

FoundationDB's client runs one network thread per process, which does not survive
``fork``: worker processes must open their store themselves (millstream's runners start
them with the ``spawn`` method), never inherit one.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from millstream._core import FdbBatch
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
from millstream.state.fdb_batch import batch_operations, binary_array, int64_bytes
from millstream.state.keys import Key, pack
from millstream.state.limits import StoreLimits
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction

FDB_API_VERSION = 730
"""The FoundationDB API version millstream selects (needs libfdb_c 7.3 or newer)."""

BINDING_REQUIREMENT = "foundationdb~=7.3.0"
"""The Python binding millstream pins: the 7.3 series passes header version 730, which every
libfdb_c from 7.3 on accepts (an 8.0 binding passes 800, which a 7.3 client refuses)."""

DEFAULT_TIMEOUT_MS = 10_000
"""Per-attempt transaction timeout: how long an unreachable cluster blocks an operation."""

DEFAULT_CLUSTER_FILE = "/etc/foundationdb/fdb.cluster"

HOME_VARIABLE = "MILLSTREAM_FDB_HOME"
"""A FoundationDB folder (``bin/fdbserver``, ``bin/fdbcli``, ``lib/libfdb_c.so``) to use
instead of an installed FoundationDB; read by every process that loads the binding."""

STANDARD_LIBRARY_PATHS = (
    "/usr/lib/libfdb_c.so",
    "/usr/lib64/libfdb_c.so",
    "/usr/local/lib/libfdb_c.so",
    "/usr/local/lib/libfdb_c.dylib",
)
"""Where FoundationDB's client packages install ``libfdb_c`` (Linux .deb/.rpm, macOS .pkg)."""

INSTALL_HINT = (
    "Install the FoundationDB client package for your platform (foundationdb-clients "
    ".deb or .rpm on Linux, the .pkg on macOS, version 7.3 or newer, matching your "
    "cluster) from https://github.com/apple/foundationdb/releases (listed on "
    "https://apple.github.io/foundationdb/downloads.html), or put libfdb_c on the library "
    "search path (LD_LIBRARY_PATH / DYLD_LIBRARY_PATH), or set MILLSTREAM_FDB_HOME to a "
    "FoundationDB folder holding lib/libfdb_c.so."
)

NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_TOO_OLD = 1007
TRANSACTION_TIMED_OUT = 1031
CLUSTER_VERSION_CHANGED = 1039
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103

MAYBE_COMMITTED = frozenset({COMMIT_UNKNOWN_RESULT, CLUSTER_VERSION_CHANGED})
"""Errors after which a commit may have been applied (the binding's
``fdb.predicates.is_maybe_committed``)."""

MAYBE_COMMITTED_AT_COMMIT = MAYBE_COMMITTED | {TRANSACTION_TIMED_OUT}
"""Errors of ``commit`` after which it may have been applied: also a timeout, which can fire
while the commit is in flight."""

RETRYABLE_NOT_COMMITTED = frozenset(
    {
        TRANSACTION_TOO_OLD,
        1009,  # future_version
        NOT_COMMITTED,
        1037,  # process_behind
        1038,  # database_locked
        1042,  # commit_proxy_memory_limit_exceeded
        1051,  # batch_transaction_throttled
        1078,  # grv_proxy_memory_limit_exceeded
        1213,  # tag_throttled
        1223,  # proxy_tag_throttled
    }
)
"""Transient errors after which the transaction was certainly not applied (the binding's
``fdb.predicates.is_retryable`` less the maybe-committed ones)."""

_INT64 = struct.Struct("<q")
_ONE = struct.pack("<q", 1)
WAKE_SUBSPACE = b"wake-on-commit"
"""``(WAKE_SUBSPACE, key)`` (``key`` packed with its store's prefix, so that a transaction
seen under another prefix wakes the same waiters) counts the commits that named ``key`` with
:meth:`~millstream.state.transaction.StoreTransaction.wake_on_commit`: a watch fires only when a
value changes, and such a commit may leave ``key`` itself unchanged (a queue's seal wakes the
readers watching its end row index). A bytes element, outside every store's prefix (whose
elements are strings): one small counter per watched key, left when a store is cleared."""
_load_lock = threading.Lock()
_loaded_pid: int | None = None


def load_fdb() -> Any:
    """Import the binding with :data:`FDB_API_VERSION` selected; the one place that does.

    Returns:
        The ``fdb`` module, ready for ``fdb.open``.

    Raises:
        StoreUnavailableError: ``libfdb_c`` is missing or too old, the binding does not
            match it, or the binding was set up in a parent process before a fork.
    """
    global _loaded_pid
    with _load_lock:
        if "fdb.impl" not in sys.modules:
            _preload_client_library()
        import fdb

        if _loaded_pid is not None and _loaded_pid != os.getpid():
            raise StoreUnavailableError(
                "the FoundationDB client was started in a parent process and does not "
                "survive fork; start worker processes with the 'spawn' start method"
            )
        if not fdb.is_api_version_selected():
            try:
                fdb.api_version(FDB_API_VERSION)
            except Exception as exc:  # the binding raises bare Exceptions
                raise StoreUnavailableError(
                    explain_load_error(
                        str(exc),
                        binding_version=_binding_version(),
                        header_version=int(fdb.LATEST_API_VERSION),
                        max_supported=_max_client_api_version(),
                        missing=isinstance(exc, OSError) or "Unable to locate" in str(exc),
                    )
                ) from exc
            fdb.impl.Future.block_until_ready = _block_in_client
        _loaded_pid = os.getpid()
    return fdb


def _block_in_client(future: Any) -> None:
    """Wait for a binding future inside the client library, the GIL released.

    The binding's own wait registers a Python callback and sleeps on a semaphore; the
    callback runs on FoundationDB's one network thread, which must take the GIL to run it.
    In a worker whose other threads hold the GIL (a mapper mapping while it serves
    GetRows), every completion then waited for the GIL, and the whole client's network
    with it. ``fdb_future_block_until_ready`` (a ctypes call: the GIL is released) waits
    without the network thread touching Python. Installed once, when :func:`load_fdb`
    selects the API version, as the binding installs its own event models.
    """
    if not future.is_ready():
        future.capi.fdb_future_block_until_ready(future.fpointer)


def _preload_client_library() -> None:
    """Load ``libfdb_c`` by absolute path before the binding loads it by name.

    The binding opens ``libfdb_c.so`` by name (the library search path, read once when the
    process starts); a library already loaded under that name is the one it gets. So
    ``$MILLSTREAM_FDB_HOME/lib`` (with the libraries beside it that it links, such as
    Boost's) or the first of :data:`STANDARD_LIBRARY_PATHS` that exists is loaded here,
    and no environment variable has to be set before the process starts.

    Raises:
        StoreUnavailableError: ``$MILLSTREAM_FDB_HOME`` is set but holds no loadable
            ``lib/libfdb_c``.
    """
    import ctypes
    import glob

    home = os.environ.get(HOME_VARIABLE)
    if home:
        lib = os.path.join(os.path.abspath(home), "lib")
        names = ("libfdb_c.so", "libfdb_c.dylib")
        library = next(
            (os.path.join(lib, n) for n in names if os.path.isfile(os.path.join(lib, n))), None
        )
        if library is None:
            raise StoreUnavailableError(
                explain_load_error(
                    f"{HOME_VARIABLE}={home} holds no lib/libfdb_c.so",
                    binding_version=_binding_version(),
                    header_version=None,
                    max_supported=None,
                    missing=True,
                )
            )
        try:
            for dependency in sorted(glob.glob(os.path.join(lib, "*.so.*"))):
                ctypes.CDLL(dependency, mode=ctypes.RTLD_GLOBAL)
            ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise StoreUnavailableError(
                explain_load_error(
                    f"{library} does not load ({exc})",
                    binding_version=_binding_version(),
                    header_version=None,
                    max_supported=None,
                    missing=True,
                )
            ) from exc
        return
    for library in STANDARD_LIBRARY_PATHS:
        if os.path.isfile(library):
            with contextlib.suppress(OSError):  # the binding then reports what it finds
                ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
            return


def _binding_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("foundationdb")
    except PackageNotFoundError:
        return "unknown"


def _max_client_api_version() -> int | None:
    """The newest API version the loaded ``libfdb_c`` serves, if it loaded at all."""
    impl = sys.modules.get("fdb.impl")
    try:
        return int(impl._capi.fdb_get_max_api_version()) if impl is not None else None
    except Exception:
        return None


def explain_load_error(
    text: str,
    *,
    binding_version: str,
    header_version: int | None,
    max_supported: int | None,
    missing: bool = False,
) -> str:
    """The message for a binding that failed to select :data:`FDB_API_VERSION`.

    Args:
        text: What the binding raised.
        binding_version: The installed ``foundationdb`` package's version.
        header_version: The API version the binding was built for (its header version,
            ``fdb.LATEST_API_VERSION``), which it passes to ``libfdb_c``; ``None`` when
            the library was not reached.
        max_supported: The newest API version the installed ``libfdb_c`` serves, when it
            loaded.
        missing: ``libfdb_c`` could not be loaded at all.
    """
    if missing or header_version is None:
        return (
            f"FoundationDB client library libfdb_c not found ({text}): the binding "
            f"foundationdb {binding_version} needs libfdb_c 7.3 or newer (API version "
            f"{FDB_API_VERSION}). {INSTALL_HINT}"
        )
    if max_supported is not None and max_supported < FDB_API_VERSION:
        return (
            f"the installed libfdb_c serves API versions up to {max_supported}, but millstream "
            f"needs API version {FDB_API_VERSION} ({text}). {INSTALL_HINT}"
        )
    if max_supported is not None and header_version > max_supported:
        return (
            f"the FoundationDB Python binding (foundationdb {binding_version}) passes header "
            f"version {header_version}, but the installed libfdb_c serves API versions up to "
            f"{max_supported} only, so it refuses the binding ({text}). Install the binding "
            f"that matches the client: pip install '{BINDING_REQUIREMENT}' (what millstream "
            f"pins; it works with every client from 7.3 on), or install a FoundationDB client "
            f"package that serves API version {header_version}."
        )
    if header_version < FDB_API_VERSION:
        return (
            f"the FoundationDB Python binding (foundationdb {binding_version}) knows API "
            f"versions up to {header_version}, but millstream needs {FDB_API_VERSION} "
            f"({text}). Install the binding it pins: pip install '{BINDING_REQUIREMENT}'."
        )
    return (
        f"FoundationDB client library libfdb_c cannot serve API version {FDB_API_VERSION} "
        f"with the binding foundationdb {binding_version} (header version {header_version}): "
        f"{text} {INSTALL_HINT}"
    )


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
    """Translate an ``fdb.FDBError`` into millstream's store errors (see :func:`store_error`)."""
    return store_error(
        int(exc.code), str(exc.description), where, retryable=bool(fdb.predicates.is_retryable(exc))
    )


def store_error(code: int, description: str, where: str, *, retryable: bool = False) -> StoreError:
    """millstream's store error for FoundationDB error ``code`` raised by operation ``where``.

    The one place that decides what a FoundationDB error means. Every error of ``commit``
    after which it may have landed (:data:`MAYBE_COMMITTED_AT_COMMIT`: the binding's
    maybe-committed errors and a timeout) becomes :class:`CommitUnknownResultError`, so no
    caller retries a commit that may have been applied as if it had not. Before the commit
    nothing can have been applied, and the same codes are plain transient errors.

    Args:
        code: The error code.
        description: The client's description of it.
        where: The operation that failed (``"commit"``, ``"get"``, ...).
        retryable: The binding's ``is_retryable`` for codes this table does not know.
    """
    text = f"FoundationDB error {code} ({description!r}) on {where}"
    if where == "commit" and code in MAYBE_COMMITTED_AT_COMMIT:
        return CommitUnknownResultError(
            f"{text}: the commit may or may not have been applied; retry only an idempotent "
            "transaction, or read whether its writes landed first"
        )
    if code == NOT_COMMITTED:
        return StoreConflictError(
            f"{text}: another transaction changed what this one read; retry it"
        )
    if code == TRANSACTION_TOO_OLD:
        return TransactionTooOldError(
            f"{text}: the transaction ran longer than five seconds; do less work per "
            "transaction (lower the reducer batch size)"
        )
    if code == TRANSACTION_TIMED_OUT:
        return StoreUnavailableError(
            f"{text}: the operation did not finish within the transaction timeout; check "
            "that the cluster is up and the cluster file current (raise timeout_ms in the "
            "URL if it is slow), and keep transactions short"
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
    if code in RETRYABLE_NOT_COMMITTED or code in MAYBE_COMMITTED or retryable:
        return RetryableStoreError(f"{text} (transient; retry)")
    return StoreError(text)


def wake_key(key: bytes) -> bytes:
    """The counter a commit that wakes the waiters of ``key`` (packed, with its store's
    prefix) adds to; see :data:`WAKE_SUBSPACE`."""
    return pack((WAKE_SUBSPACE, key))


class FdbTransaction(StoreTransaction):
    """A transaction on a :class:`FdbStore`: a thin layer over ``fdb.Transaction``."""

    def __init__(self, store: FdbStore) -> None:
        super().__init__(store)
        self._fdb = store.fdb
        self._batch = store.batch
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
        if not keys:
            return []
        with self._errors("get_many"):
            return self._batch.get_many(self._tr.tpointer, binary_array(keys), snapshot)

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
        if not keys:
            return
        with self._errors("set_many"):
            self._batch.set_many(self._tr.tpointer, binary_array(keys), binary_array(values))

    def _raw_clear(self, key: bytes) -> None:
        with self._errors("clear"):
            self._tr.clear(key)

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        with self._errors("clear_range"):
            self._tr.clear_range(begin, end)

    def _raw_add(self, key: bytes, delta: int) -> None:
        with self._errors("add"):
            self._tr.add(key, _INT64.pack(delta))

    def _raw_add_many(self, keys: Sequence[bytes], deltas: list[int]) -> None:
        if not keys:
            return
        with self._errors("add_many"):
            self._batch.add_many(self._tr.tpointer, binary_array(keys), int64_bytes(deltas))

    def _raw_add_lanes(self, keys: Sequence[bytes], deltas: list[bytes]) -> None:
        # One ADD per key in the slot layout (keys.SLOT_BYTES): no read, no conflict.
        if not keys:
            return
        with self._errors("add_many"):
            self._batch.add_lanes(
                self._tr.tpointer, binary_array(keys), b"".join(deltas), len(deltas[0]) // 8
            )

    def _raw_wake(self, key: bytes) -> None:
        with self._errors("wake_on_commit"):
            self._tr.add(wake_key(key), _ONE)

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
        self._batch = batch_operations(self._fdb)
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
    def batch(self) -> FdbBatch:
        """The batch operations on this process's ``libfdb_c`` (see
        :mod:`millstream.state.fdb_batch`)."""
        return self._batch

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

    def wait_for(
        self, key: Key, until: Callable[[bytes | None], bool], timeout_seconds: float
    ) -> None:
        """See :meth:`Store.wait_for`: watches on ``key`` and on its wake counter
        (:data:`WAKE_SUBSPACE`), set in the transaction that read it, so that a write
        committed after the read fires one (FoundationDB watches fire on any change from the
        value the transaction saw)."""
        raw = self.prefix_bytes + pack(key)
        tr = self.database.create_transaction()
        try:
            value = tr.snapshot.get(raw).wait().value
            if until(value):
                return
            watches = [tr.watch(raw), tr.watch(wake_key(raw))]
            tr.commit().wait()
            fired = threading.Event()
            for watch in watches:
                watch.on_ready(lambda _: fired.set())
            fired.wait(max(0.0, timeout_seconds))
            for watch in watches:
                watch.cancel()
        except self._fdb.FDBError as exc:
            raise map_fdb_error(self._fdb, exc, "wait_for") from exc

    def close(self) -> None:
        """Nothing to release: the binding keeps one connection per cluster file."""


__all__ = [
    "BINDING_REQUIREMENT",
    "DEFAULT_TIMEOUT_MS",
    "FDB_API_VERSION",
    "MAYBE_COMMITTED",
    "MAYBE_COMMITTED_AT_COMMIT",
    "FdbStore",
    "FdbTransaction",
    "explain_load_error",
    "fdb_availability",
    "load_fdb",
    "map_fdb_error",
    "store_error",
    "wake_key",
]
