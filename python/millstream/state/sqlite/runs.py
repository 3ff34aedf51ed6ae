"""Delta runs: large ``add_many`` batches kept as sorted, compressed runs beside the table.

Upserting a commit's counters into the key-value B-tree rewrites every page its keys land
on: a commit of 300,000 random keys into a table of millions rewrites nearly the whole
table, through the write-ahead log and again into the file. A batch of adds is blind (it
reads nothing), so it need not touch the table at all: the store keeps it as a *run*, one
row of the ``runs`` table holding the batch's keys sorted with repeats folded and their
int64 deltas, as an Arrow IPC stream compressed with zstd. A commit then writes a few
bytes per changed key, whatever the table holds (the log-structured merge idea).

The value of a key is its table value (if any) with the deltas of every run holding it
added in the runs' order (``ord``), by FoundationDB's ``ADD`` rule
(:func:`~millstream.state.add_int64s`). Reads fold the runs in
(:class:`~millstream.state.sqlite.transaction.SqliteTransaction`), so nothing above the
backend sees them. Runs stay few: beyond ``MERGE_ABOVE`` of them, ``FANOUT`` runs of one
size class and width merge into one (each delta is rewritten about log_FANOUT(total / run)
times), after the commit that added the run, on a thread of the committing process
(:class:`RunMerger`), outside the write lock and by one process at a time
(:func:`merge_runs`). A write
to a key a run holds that does not commute with the run's adds (a set, a clear, a cleared
range, an add of another width) first folds every run into the table
(:meth:`RunWriter.flush`), so the table never holds a write newer than a run on the same
key.

A run is written in its committing transaction, with the rest of the commit: all or
nothing, as the commit itself; a merge or fold changes no key's value. A run's row also
holds a generation, random bytes drawn for each run stored: the decoded runs a process
keeps (:class:`RunCache`) are checked against it, and a write transaction never puts the
runs it wrote there (until it commits they are not the table's: a rolled-back id is given
to the next run committed).
"""

from __future__ import annotations

import fcntl
import math
import os
import secrets
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.state.keys import EncodedKeys, add_int64s
from millstream.state.sqlite.sql import SQL_ADD, SQL_ADD_LANES, begin_transaction

DEFAULT_RUN_MIN_KEYS = 256
"""Keys an ``add_many`` must hold to become a run (fewer: upserted into the table, where
a few keys dirty a few pages). Even a commit of a thousand keys into a table of 100,000
dirties most of its pages (1,250 keys: ~750 pages of 4 KiB, 11 ms of commit against 1 for
the run), and the store's one write lock queues every other writer behind it.
``run_min_keys=N`` in the store URL; 0 never makes runs."""

INDEXED_KEYS = 16_384
"""Runs of at most this many keys answer point reads from a dictionary of their keys."""

FANOUT = 8
"""Runs of one size class that merge into one."""

MERGE_ABOVE = 24
"""Runs kept before any merge: a job of a few dozen commits never merges (its output is
read once, at the end, when a range read sums the runs in one pass anyway); a longer one
merges a group whenever the runs exceed this, so reads fold at most about this many."""

MAX_RUNS = 64
"""More runs than this (widths alternating so that none merge) fold into the table."""

SQL_CREATE_RUNS = (
    "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "ord INTEGER NOT NULL, lo BLOB NOT NULL, hi BLOB NOT NULL, width INTEGER NOT NULL, "
    "entries INTEGER NOT NULL, data BLOB NOT NULL, generation BLOB)"
)
SQL_ADD_RUN_GENERATION = "ALTER TABLE runs ADD COLUMN generation BLOB"
"""Schema version 4: runs carry a :func:`generation` (NULL: stored before)."""
SQL_LIST_RUNS = "SELECT id, ord, lo, hi, width, entries, generation FROM runs ORDER BY ord"
SQL_RUN_DATA = "SELECT data FROM runs WHERE id = ?"
SQL_INSERT_RUN = (
    "INSERT INTO runs (ord, lo, hi, width, entries, data, generation) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id"
)
SQL_DELETE_RUN = "DELETE FROM runs WHERE id = ?"

_ZSTD = pa.Codec("zstd")
_ZSTD_RUN = b"MSRZ"
"""A run's stored bytes begin with this, then the Arrow IPC stream's length (uint64, little
endian), then the stream compressed whole with zstd (store schema version 3). Arrow's own
IPC compression starts a codec per buffer: on a run of 600 keys, what a commit at half of
peak load writes, compressing the stream whole takes 40 % of its encode time and 45 % of
its decode time, at the same size (5,000 keys: 7 % more bytes; 50,000: 1 % more, no
faster; ``bench/micro/test_runs.py``). Runs of version 2 (an IPC stream with
zstd-compressed buffers, which begins with ``0xFFFFFFFF``) decode as they are."""


@dataclass(frozen=True)
class RunInfo:
    """One row of ``runs`` without its data: enough to tell which keys it may hold."""

    id: int
    ord: int
    lo: bytes
    hi: bytes
    width: int
    entries: int
    generation: bytes | None = None
    """The run's :func:`generation` (None: a run of schema version 3 or earlier)."""

    def covers(self, key: bytes) -> bool:
        """Whether ``key`` lies in the run's key range (it may still not hold it)."""
        return self.lo <= key <= self.hi

    def overlaps(self, begin: bytes, end: bytes) -> bool:
        """Whether the run's key range meets ``[begin, end)``."""
        return self.lo < end and begin <= self.hi


def generation() -> bytes:
    """Drawn for each run stored and kept with it: what tells a decoded run from another
    run later stored under its id (free to make, unlike a digest of the run's data)."""
    return secrets.token_bytes(16)


def list_runs(conn: sqlite3.Connection) -> list[RunInfo]:
    """The runs in the connection's current snapshot, oldest first."""
    return [RunInfo(*row) for row in conn.execute(SQL_LIST_RUNS)]


class Run:
    """A run's keys (sorted, unique) and deltas: ``width`` int64 lanes per key."""

    def __init__(self, keys: pa.BinaryArray, deltas: np.ndarray) -> None:
        self.keys = keys
        """Full keys, sorted, no repeats."""
        self.deltas = deltas
        """Shape (keys, width), little-endian int64."""
        self._positions: dict[bytes, int] | None = None

    @property
    def width(self) -> int:
        return int(self.deltas.shape[1])

    def __len__(self) -> int:
        return len(self.keys)

    def _lower_bound(self, key: bytes) -> int:
        lo, hi = 0, len(self.keys)
        keys = self.keys
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid].as_py() < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def delta(self, key: bytes) -> bytes | None:
        """The delta the run holds for ``key``, or None.

        A small run answers from a dictionary of its keys, made at the first point read
        (a binary search over Arrow scalars costs microseconds a step, and a read folds
        every run that may hold its key); a big one by binary search.
        """
        if len(self.keys) <= INDEXED_KEYS:
            if self._positions is None:
                self._positions = {k: n for n, k in enumerate(self.keys.to_pylist())}
            n = self._positions.get(key)
            return None if n is None else bytes(self.deltas[n].tobytes())
        i = self._lower_bound(key)
        if i < len(self.keys) and self.keys[i].as_py() == key:
            return bytes(self.deltas[i].tobytes())
        return None

    def lanes(self, i: int = 0, j: int | None = None) -> list[bytes]:
        """The deltas of the run's keys ``i`` to ``j`` (exclusive), one ``bytes`` of
        ``8 * width`` per key, as ``ADD`` takes them."""
        raw = self.deltas[i:j].tobytes()
        step = 8 * self.width
        return [raw[n : n + step] for n in range(0, len(raw), step)]

    def items(self, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """``(key, delta)`` for the keys in ``[begin, end)``, in key order."""
        i, j = self._lower_bound(begin), self._lower_bound(end)
        if i >= j:
            return []
        keys = self.keys.slice(i, j - i).to_pylist()
        return list(zip(keys, self.lanes(i, j), strict=True))

    def slice(self, begin: bytes, end: bytes) -> Run:
        """The run's keys in ``[begin, end)``."""
        i, j = self._lower_bound(begin), self._lower_bound(end)
        return Run(self.keys.slice(i, max(j - i, 0)), self.deltas[i:j])

    def holds_any(self, begin: bytes, end: bytes) -> bool:
        """Whether the run holds a key in ``[begin, end)``."""
        return self._lower_bound(begin) < self._lower_bound(end)

    def encode(self) -> bytes:
        """The run as stored: the keys after their common prefix, one int64 column per
        lane, in an Arrow IPC stream (the prefix in its metadata) compressed with zstd
        (see ``_ZSTD_RUN``)."""
        lo, hi = self.keys[0].as_py(), self.keys[-1].as_py()
        prefix = _common_prefix(lo, hi)
        suffixes = _cut(self.keys, len(prefix))
        columns = [suffixes] + [pa.array(self.deltas[:, n]) for n in range(self.width)]
        names = ["key"] + [f"d{n}" for n in range(self.width)]
        batch = pa.record_batch(columns, names=names).replace_schema_metadata(
            {"prefix": prefix.hex()}
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        stream = sink.getvalue()
        return b"".join(
            (_ZSTD_RUN, stream.size.to_bytes(8, "little"), _ZSTD.compress(stream, asbytes=True))
        )

    @staticmethod
    def stream(data: bytes) -> pa.Buffer:
        """The Arrow IPC stream of a run's stored bytes (schema version 2 or 3)."""
        if not data.startswith(_ZSTD_RUN):
            return pa.py_buffer(data)
        at = len(_ZSTD_RUN)
        size = int.from_bytes(data[at : at + 8], "little")
        return _ZSTD.decompress(memoryview(data)[at + 8 :], decompressed_size=size)

    @classmethod
    def decode(cls, data: bytes) -> Run:
        """A run from :meth:`encode`'s bytes."""
        table = pa.ipc.open_stream(cls.stream(data)).read_all()
        prefix = bytes.fromhex((table.schema.metadata or {}).get(b"prefix", b"").decode())
        suffixes = table.column("key").combine_chunks()
        keys = _join(prefix, suffixes)
        width = table.num_columns - 1
        deltas = np.empty((len(keys), width), dtype="<i8")
        for n in range(width):
            deltas[:, n] = table.column(f"d{n}").to_numpy()
        return cls(keys, deltas)

    @classmethod
    def fold(cls, keys: pa.BinaryArray, deltas: np.ndarray) -> Run:
        """A run of ``keys`` (any order, repeats allowed) and their deltas: sorted, each
        key's deltas added lane by lane (wrapping around in 64 bits, as ``ADD`` does)."""
        if len(keys) > 1 and not pc.all(pc.less_equal(keys[:-1], keys[1:])).as_py():
            order = pc.sort_indices(keys).to_numpy()
            keys = keys.take(order)
            deltas = deltas[order]
        if len(keys) > 1:
            differs = pc.not_equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
            if not differs.all():
                starts = np.flatnonzero(np.concatenate([[True], differs]))
                keys = keys.take(starts)
                with np.errstate(over="ignore"):
                    deltas = np.add.reduceat(deltas, starts, axis=0)
        return cls(keys, np.ascontiguousarray(deltas, dtype="<i8"))

    @classmethod
    def of_batch(cls, keys: Sequence[bytes], deltas: list[int] | list[bytes]) -> Run:
        """A run of one ``add_many``: int deltas (one lane) or lanes as bytes."""
        if isinstance(keys, EncodedKeys):
            array = keys.array.cast(pa.binary())
        else:
            array = pa.array(list(keys), pa.binary())
        if deltas and isinstance(deltas[0], bytes):
            raw = b"".join(deltas)
            width = len(deltas[0]) // 8
            lanes = np.frombuffer(raw, dtype="<i8").reshape(len(keys), width)
        else:
            lanes = np.asarray(deltas, dtype=np.int64).reshape(len(keys), 1)
        return cls.fold(array, lanes)

    @classmethod
    def merge(cls, runs: list[Run]) -> Run:
        """One run holding what ``runs`` (all of one width) hold together."""
        keys = pa.concat_arrays([run.keys for run in runs])
        deltas = np.concatenate([run.deltas for run in runs])
        return cls.fold(keys, deltas)


def _common_prefix(a: bytes, b: bytes) -> bytes:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _cut(keys: pa.Array, length: int) -> pa.BinaryArray:
    """``keys`` without their first ``length`` bytes."""
    # An explicit stop: binary_slice without one fails on some arrays (pyarrow 26).
    return pc.binary_slice(keys, length, 2**31 - 1) if length else keys


def _join(prefix: bytes, suffixes: pa.Array) -> pa.BinaryArray:
    """``prefix`` put before each of ``suffixes``."""
    if not prefix:
        return suffixes.cast(pa.binary())
    empty = pa.scalar(b"", pa.binary())
    return pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), suffixes, empty)


class RunCache:
    """Decoded runs by id, shared by a store's transactions.

    Only runs of committed snapshots enter it: a committed run never changes (a merge
    writes a new one) and its id is never given to another. A run a write transaction
    inserted is not committed until that transaction is, and SQLite gives the id of a
    rolled-back insert to the next run committed, so such runs stay out
    (:meth:`RunWriter.run`). Each entry is also checked against the generation the table
    holds for the id.
    """

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._runs: OrderedDict[int, tuple[bytes | None, Run]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, conn: sqlite3.Connection, info: RunInfo) -> Run:
        """The run ``info`` names, read through ``conn`` (whose snapshot holds it, committed)."""
        with self._lock:
            entry = self._runs.get(info.id)
            if entry is not None and entry[0] == info.generation:
                self._runs.move_to_end(info.id)
                return entry[1]
        row = conn.execute(SQL_RUN_DATA, (info.id,)).fetchone()
        if row is None:
            raise sqlite3.DatabaseError(f"run {info.id} is missing from the runs table")
        run = Run.decode(row[0])
        with self._lock:
            self._runs[info.id] = (info.generation, run)
            while len(self._runs) > self._size:
                self._runs.popitem(last=False)
        return run


def fold_value(
    cache: RunCache,
    conn: sqlite3.Connection,
    runs: list[RunInfo],
    key: bytes,
    stored: bytes | None,
) -> bytes | None:
    """``key``'s value: its table value ``stored`` with the deltas of the runs folded in."""
    for info in runs:
        if info.covers(key):
            delta = cache.get(conn, info).delta(key)
            if delta is not None:
                stored = add_int64s(stored, delta)
    return stored


def fold_many(
    cache: RunCache,
    conn: sqlite3.Connection,
    runs: list[RunInfo],
    keys: list[bytes],
    found: dict[bytes, bytes],
) -> None:
    """:func:`fold_value` for each of ``keys`` (unique) into ``found`` (table values).

    A few keys are looked up by binary search; many at once in Arrow
    (``index_in``, one hash of the run's keys), so reading back a batch of the keys a big
    ``add_many`` wrote costs about what the batch did.
    """
    for info in runs:
        candidates = [k for k in keys if info.covers(k)]
        if not candidates:
            continue
        run = cache.get(conn, info)
        if len(candidates) * 64 < len(run):
            hits = [(k, run.delta(k)) for k in candidates]
        else:
            where = pc.index_in(pa.array(candidates, pa.binary()), value_set=run.keys)
            hits = [
                (k, None if i is None else run.deltas[i].tobytes())
                for k, i in zip(candidates, where.to_pylist(), strict=True)
            ]
        for key, delta in hits:
            if delta is not None:
                found[key] = add_int64s(found.get(key), delta)


def fold_range(
    cache: RunCache,
    conn: sqlite3.Connection,
    runs: list[RunInfo],
    rows: list[tuple[bytes, bytes]],
    begin: bytes,
    end: bytes,
) -> list[tuple[bytes, bytes]]:
    """The table's ``rows`` in ``[begin, end)`` with the runs folded in, in key order.

    Consecutive runs of one width are summed in Arrow first (:meth:`Run.merge`), so a
    range over millions of keys pays Python per key once, not once per run.
    """
    groups: list[list[Run]] = []
    for info in runs:
        if not info.overlaps(begin, end):
            continue
        run = cache.get(conn, info)
        if groups and groups[-1][0].width == run.width:
            groups[-1].append(run)
        else:
            groups.append([run])
    values: dict[bytes, bytes] = dict(rows)
    for group in groups:
        run = group[0] if len(group) == 1 else Run.merge([r.slice(begin, end) for r in group])
        items = run.items(begin, end)
        if not values:
            values = dict(items)
            if len(groups) == 1:
                return items  # one sorted source: no fold, no sort
            continue
        for key, delta in items:
            values[key] = add_int64s(values.get(key), delta)
    return sorted(values.items())


@dataclass(frozen=True)
class EncodedRun:
    """A run and its stored bytes, made from an ``add_many`` before the commit takes the
    write lock: both depend on the batch alone, and every other writer waits while the
    lock is held."""

    run: Run
    data: bytes
    generation: bytes
    """Stored with the run (:func:`generation`)."""

    @classmethod
    def of_run(cls, run: Run) -> EncodedRun:
        """``run``, encoded."""
        data = run.encode()
        return cls(run, data, generation())

    @classmethod
    def of_batch(cls, keys: Sequence[bytes], deltas: list[int] | list[bytes]) -> EncodedRun:
        """The run of one ``add_many`` (see :meth:`Run.of_batch`), encoded."""
        return cls.of_run(Run.of_batch(keys, deltas))


def becomes_run(keys: Sequence[bytes], min_keys: int) -> bool:
    """Whether an ``add_many`` of ``keys`` is stored as a run (``run_min_keys``)."""
    return min_keys > 0 and len(keys) >= min_keys


def _insert(conn: sqlite3.Connection, encoded: EncodedRun, order: int) -> RunInfo:
    """Store ``encoded`` at ``order`` among the runs."""
    run = encoded.run
    lo, hi = run.keys[0].as_py(), run.keys[-1].as_py()
    values = (order, lo, hi, run.width, len(run), encoded.data, encoded.generation)
    (run_id,) = conn.execute(SQL_INSERT_RUN, values).fetchone()
    return RunInfo(run_id, order, lo, hi, run.width, len(run), encoded.generation)


def _size_class(entries: int, min_keys: int) -> int:
    base = max(min_keys, 1)
    return int(math.log(max(entries, base) / base, FANOUT) + 1e-9)


def merge_due(runs: list[RunInfo], min_keys: int) -> list[RunInfo]:
    """Runs to merge into one: when there are more than ``MERGE_ABOVE``, ``FANOUT`` runs of
    one size class (entries within a factor ``FANOUT`` of each other, counted from
    ``min_keys``), the smallest class that has that many; else none.

    The runs of one width that lie between runs of other widths commute (their deltas add
    lane by lane), so a group is any runs of such a stretch, not only neighbours: runs that
    two writers add in turn, or that merges left of several sizes, interleave, and a group
    of neighbours would seldom form. A stretch of more than ``MERGE_ABOVE`` runs without a
    full class merges its ``FANOUT`` smallest runs, so the runs stay few whatever their
    sizes.
    """
    if len(runs) <= MERGE_ABOVE:
        return []
    stretches: list[list[RunInfo]] = []
    for info in runs:
        if stretches and stretches[-1][0].width == info.width:
            stretches[-1].append(info)
        else:
            stretches.append([info])
    for stretch in stretches:
        classes: dict[int, list[RunInfo]] = {}
        for info in stretch:
            classes.setdefault(_size_class(info.entries, min_keys), []).append(info)
        for size in sorted(classes):
            if len(classes[size]) >= FANOUT:
                return classes[size][:FANOUT]
    longest = max(stretches, key=len)
    if len(longest) > MERGE_ABOVE:
        smallest = sorted(longest, key=lambda info: info.entries)[:FANOUT]
        return sorted(smallest, key=lambda info: info.ord)
    return []


class MergeLock:
    """One merger at a time among the processes of a store: the writers of a busy store
    all see the same group due and would each compute the same merge, of which all but
    one are thrown away. A non-blocking ``flock`` of a file beside the database (released
    by the kernel if its holder dies); a process that does not get it leaves the merge to
    the one that has it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()
        self._threads = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[bool]:
        """Whether this process holds the lock, for the ``with`` block."""
        if self._pid != os.getpid():
            # A forked child starts afresh: a lock taken through the parent's file would be
            # the parent's lock too, and the parent's threads may have held the other.
            self._fd, self._pid, self._threads = None, os.getpid(), threading.Lock()
        if not self._threads.acquire(blocking=False):
            yield False
            return
        try:
            fd = self._file()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def close(self) -> None:
        """Close the lock's file (this process's)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


def merge_runs(conn: sqlite3.Connection, cache: RunCache, min_keys: int, timeout_ms: int) -> int:
    """Merge runs while :func:`merge_due` finds a group; returns how many merges.

    The merge is computed from a read snapshot, outside the write lock (a merge of
    millions of keys takes seconds, which other writers must not wait for); a short write
    transaction then swaps the group for the merged run if the group is still there (a
    concurrent merge or fold may have taken it: then nothing is written). The merged run
    takes the place of the group's newest, so the runs' order is kept, and it holds the
    group's sums, so no key's value changes: no reader conflicts with a merge.
    """
    merges = 0
    while True:
        rows = begin_transaction(conn, ("BEGIN", SQL_LIST_RUNS), timeout_ms)
        try:
            group = merge_due([RunInfo(*row) for row in rows], min_keys)
            merged = Run.merge([cache.get(conn, info) for info in group]) if group else None
        finally:
            conn.execute("COMMIT")
        if merged is None:
            return merges
        encoded = EncodedRun.of_run(merged)
        ids = [info.id for info in group]
        begin_transaction(conn, ("BEGIN IMMEDIATE",), timeout_ms)
        try:
            marks = ",".join("?" * len(ids))
            (present,) = conn.execute(
                f"SELECT count(*) FROM runs WHERE id IN ({marks})", ids
            ).fetchone()
            if present != len(ids):
                conn.execute("ROLLBACK")
                return merges
            conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", ids)
            _insert(conn, encoded, group[-1].ord)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        merges += 1


class RunMerger:
    """Merges runs on a thread of its own, so that the commit that made a merge due
    returns at once: a merge of big runs takes a tenth of a second and more, which a
    reducer would otherwise spend between its commits while rows wait for it.

    ``merge()`` does one round of merges (its own connection, the :class:`MergeLock`, its
    failures logged); :meth:`request` wakes the thread, started on first use in each
    process (a forked child starts its own).
    """

    def __init__(self, merge: Callable[[], None]) -> None:
        self._merge = merge
        self._pid = -1
        self._changed = threading.Condition()
        self._requested = 0
        """Requests so far; a round started after request ``n`` serves it."""
        self._served = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        """Merge soon (what is due then)."""
        if self._closed:
            return
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._changed = threading.Condition()  # the parent's threads may have held it
            self._requested = self._served = 0
            self._thread = threading.Thread(
                target=self._run, name="millstream-run-merger", daemon=True
            )
            self._thread.start()
        with self._changed:
            self._requested += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._requested > self._served)
                if self._closed:
                    return
                round_serves = self._requested
            self._merge()
            with self._changed:
                self._served = round_serves
                self._changed.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the merges requested so far are done; False on timeout."""
        if self._thread is None or self._pid != os.getpid():
            return True
        with self._changed:
            wanted = self._requested
            return self._changed.wait_for(lambda: self._served >= wanted, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after the merge under way (none is left half done: a merge
        swaps its runs in one transaction)."""
        if self._pid != os.getpid():  # no thread here (a forked child's is its own)
            self._closed = True
            return
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None and self._pid == os.getpid():
            self._thread.join(timeout)


class RunWriter:
    """The runs side of one commit, under the write lock: adds runs, and folds them into
    the table when a write needs it."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        cache: RunCache,
        runs: list[RunInfo],
    ) -> None:
        self.conn = conn
        self.cache = cache
        self.runs = runs
        self.added = False
        """Whether this commit wrote a run (then it, and only it, may merge after)."""
        self._own: dict[int, Run] = {}
        """The runs this commit wrote, by id: never in the shared cache (see
        :class:`RunCache`)."""

    def run(self, info: RunInfo) -> Run:
        """The run ``info`` names: one this commit wrote, or a committed one."""
        own = self._own.get(info.id)
        return own if own is not None else self.cache.get(self.conn, info)

    def add(self, encoded: EncodedRun) -> None:
        """Store an ``add_many`` as a new run (merges come after the commit, outside
        the write lock: :func:`merge_runs`)."""
        order = self.runs[-1].ord + 1 if self.runs else 0
        info = _insert(self.conn, encoded, order)
        self._own[info.id] = encoded.run
        self.runs.append(info)
        self.added = True
        if len(self.runs) > MAX_RUNS:
            self.flush()

    def needs_flush(self, keys: Iterable[bytes], kind_width: Callable[[bytes], int]) -> bool:
        """Whether writing to ``keys`` must fold the runs into the table first: a run
        holds one of them and the write does not commute with it.

        ``kind_width(key)`` is the width of an add to the key (lanes), or 0 for a set or
        clear; a same-width add commutes with the runs (lane sums), anything else must
        come after them.
        """
        if not self.runs:
            return False
        for key in keys:
            for info in self.runs:
                if (
                    info.covers(key)
                    and kind_width(key) != info.width
                    and self.run(info).delta(key) is not None
                ):
                    return True
        return False

    def overlaps(self, begin: bytes, end: bytes) -> bool:
        """Whether a run holds a key in ``[begin, end)`` (a cleared range)."""
        return any(
            info.overlaps(begin, end) and self.run(info).holds_any(begin, end) for info in self.runs
        )

    def flush(self) -> None:
        """Fold every run into the table, oldest first, and drop them."""
        for info in self.runs:
            run = self.run(info)
            keys = run.keys.to_pylist()
            if run.width == 1:
                deltas: list[Any] = run.deltas[:, 0].tolist()
                self.conn.executemany(SQL_ADD, zip(keys, deltas, strict=True))
            else:
                self.conn.executemany(SQL_ADD_LANES, zip(keys, run.lanes(), strict=True))
            self.conn.execute(SQL_DELETE_RUN, (info.id,))
        self.runs = []
