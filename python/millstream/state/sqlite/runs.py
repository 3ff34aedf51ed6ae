"""Delta runs and their stored format: large ``add_many`` batches kept as sorted,
compressed runs beside the table.

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
(:class:`~millstream.state.sqlite.run_merge.RunMerger`), outside the write lock and by one
process at a time (:func:`~millstream.state.sqlite.run_merge.merge_runs`). A write
to a key a run holds that does not commute with the run's adds (a set, a clear, a cleared
range, an add of another width) first folds every run into the table
(:meth:`~millstream.state.sqlite.run_writer.RunWriter.flush`), so the table never holds a
write newer than a run on the same key.

A run is written in its committing transaction, with the rest of the commit: all or
nothing, as the commit itself; a merge or fold changes no key's value. A run's row also
holds a generation, random bytes drawn for each run stored: the decoded runs a process
keeps (:class:`~millstream.state.sqlite.run_cache.RunCache`) are checked against it, and a
write transaction never puts the runs it wrote there (until it commits they are not the
table's: a rolled-back id is given to the next run committed).
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.state.keys import EncodedKeys

DEFAULT_RUN_MIN_KEYS = 256
"""Keys an ``add_many`` must hold to become a run, together with the batches of its width
next to it in the commit (fewer: upserted into the table, where a few keys dirty a few
pages; :func:`~millstream.state.sqlite.write_buffer.run_stretches`). Even a commit of a
thousand keys into a table of 100,000 dirties most of its pages (1,250 keys: ~750 pages
of 4 KiB, 11 ms of commit against 1 for the run), and the store's one write lock queues
every other writer behind it.
``run_min_keys=N`` in the store URL; 0 never makes runs."""

INDEXED_KEYS = 16_384
"""Runs of at most this many keys answer point reads from a dictionary of their keys."""

RUNS_COLUMNS = (
    "id INTEGER PRIMARY KEY AUTOINCREMENT, ord INTEGER NOT NULL, lo BLOB NOT NULL, "
    "hi BLOB NOT NULL, width INTEGER NOT NULL, entries INTEGER NOT NULL, generation BLOB, "
    "data BLOB NOT NULL"
)
"""The runs table's columns, ``data`` last. SQLite reads a row's columns in order, and a
column stored after a large value is reached only by reading that value's overflow pages:
with ``generation`` after ``data`` (schema version 4), listing the runs at the start of
every transaction read every run's data, 46 ms for 30 runs of 2 MB against 0.1 with
``data`` last."""
SQL_CREATE_RUNS = f"CREATE TABLE IF NOT EXISTS runs ({RUNS_COLUMNS})"
SQL_LIST_RUNS = "SELECT id, ord, lo, hi, width, entries, generation FROM runs ORDER BY ord"
SQL_RUN_DATA = "SELECT data FROM runs WHERE id = ?"
SQL_INSERT_RUN = (
    "INSERT INTO runs (ord, lo, hi, width, entries, generation, data) "
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


def upgrade_runs_table(conn: sqlite3.Connection, keep_generations: bool) -> None:
    """Give the runs table of an older store today's columns (:data:`RUNS_COLUMNS`), in
    the caller's write transaction: a table without ``generation``, or with it after
    ``data``, is copied into a new one, ids and the id sequence kept. Generations are kept
    where ``keep_generations`` (schema version 4), else NULL (runs stored before there were
    any). Runs already in today's order only lose their generations, if asked."""
    conn.execute(SQL_CREATE_RUNS)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    if columns[-1] != "data" or "generation" not in columns:
        generation = "generation" if keep_generations and "generation" in columns else "NULL"
        sequence = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'runs'").fetchone()
        conn.execute(f"CREATE TABLE runs_upgraded ({RUNS_COLUMNS})")
        conn.execute(
            "INSERT INTO runs_upgraded (id, ord, lo, hi, width, entries, generation, data) "
            f"SELECT id, ord, lo, hi, width, entries, {generation}, data FROM runs"
        )
        conn.execute("DROP TABLE runs")
        conn.execute("ALTER TABLE runs_upgraded RENAME TO runs")
        if sequence is not None:
            # A dropped table's sequence goes with it; the next id stays above every id
            # ever given, as AUTOINCREMENT promises.
            conn.execute(
                "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'runs'", sequence
            )
    elif not keep_generations:
        conn.execute("UPDATE runs SET generation = NULL")


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


def insert_run(conn: sqlite3.Connection, encoded: EncodedRun, order: int) -> RunInfo:
    """Store ``encoded`` at ``order`` among the runs."""
    run = encoded.run
    lo, hi = run.keys[0].as_py(), run.keys[-1].as_py()
    values = (order, lo, hi, run.width, len(run), encoded.generation, encoded.data)
    (run_id,) = conn.execute(SQL_INSERT_RUN, values).fetchone()
    return RunInfo(run_id, order, lo, hi, run.width, len(run), encoded.generation)
