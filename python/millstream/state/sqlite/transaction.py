"""A transaction of the embedded store: a consistent read snapshot, buffered writes, and a
commit that re-checks what it read under the write lock (optimistic, key-granular)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from millstream.exceptions import (
    StoreConflictError,
)
from millstream.state.sqlite.run_cache import fold_many, fold_range, fold_value
from millstream.state.sqlite.run_merge import merge_due
from millstream.state.sqlite.run_writer import RunWriter
from millstream.state.sqlite.runs import (
    SQL_LIST_RUNS,
    EncodedRun,
    Run,
    RunInfo,
    list_runs,
)
from millstream.state.sqlite.sql import (
    FEW_KEYS,
    IN_CHUNK,
    SQL_ADD,
    SQL_ADD_LANES,
    SQL_CLEAR,
    SQL_CLEAR_RANGE,
    SQL_GET,
    SQL_SET,
    begin_transaction,
    norm,
)
from millstream.state.sqlite.write_buffer import (
    ADD,
    CLEAR,
    SET,
    BatchAdd,
    BatchSet,
    ClearRange,
    Op,
    PointOps,
    apply_adds,
    compose,
    run_stretches,
)
from millstream.state.transaction import StoreTransaction

if TYPE_CHECKING:
    from millstream.state.sqlite.store import SqliteStore


def _digest_row(digest: hashlib.blake2b, key: bytes, value: bytes) -> None:
    """Add one ``(key, value)`` of a range read to its digest (lengths first, no copies)."""
    digest.update(len(key).to_bytes(4, "little"))
    digest.update(key)
    digest.update(len(value).to_bytes(4, "little"))
    digest.update(value)


class SqliteTransaction(StoreTransaction):
    """A transaction on a :class:`SqliteStore` (see the module docstring for the model)."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self._sqlite = store
        self._conn: sqlite3.Connection | None = None
        self._log: list[Op] = []
        self._reads: dict[bytes, bytes | None] = {}
        self._ranges: list[tuple[bytes, bytes, bool, bytes]] = []
        self._runs: list[RunInfo] = []
        """The delta runs of the read snapshot (see :mod:`millstream.state.sqlite.runs`)."""

    # -- connection ---------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = self._sqlite.checkout()
            try:
                # Start the snapshot now (listing its runs): a busy answer is retried here,
                # not on a later read.
                rows = begin_transaction(
                    conn, ("BEGIN", SQL_LIST_RUNS), self._sqlite.busy_timeout_ms
                )
            except sqlite3.Error as exc:
                self._sqlite.release(conn)
                raise self._sqlite.error(exc) from exc
            self._runs = [RunInfo(*row) for row in rows]
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

    def _buffered(self, key: bytes) -> tuple[bool, bytes | None, list[int | bytes] | None]:
        """Resolve ``key`` against the write buffer.

        Returns ``(resolved, value, pending_adds)``: when ``resolved`` is false the stored
        value is needed, plus the adds in ``pending_adds`` (oldest first) if not None.
        """
        pending: list[int | bytes] = []
        for op in reversed(self._log):
            if isinstance(op, PointOps):
                entry = op.ops.get(key)
                if entry is None:
                    continue
                kind, payload = entry
                if kind == ADD:
                    pending.append(payload)
                    continue
                base = payload if kind == SET else None
            elif isinstance(op, ClearRange):
                if not op.begin <= key < op.end:
                    continue
                base = None
            elif isinstance(op, BatchSet):
                value = op.index().get(key)
                if value is None:
                    continue
                base = value
            else:
                if not op.may_hold(key):
                    continue
                delta = op.index().get(key)
                if delta is None:
                    continue
                pending.append(delta)
                continue
            if not pending:
                return True, base, None
            return True, apply_adds(base, pending[::-1]), None
        return False, None, pending[::-1] or None

    def _overlay(self, begin: bytes, end: bytes) -> dict[bytes, bytes | None]:
        """Buffered keys in ``[begin, end)`` with their read-your-writes values."""
        keys: set[bytes] = set()
        for op in self._log:
            if isinstance(op, PointOps):
                candidates: Iterable[bytes] = op.ops
            elif isinstance(op, BatchSet | BatchAdd):
                candidates = op.index()
            else:
                continue
            keys.update(k for k in candidates if begin <= k < end)
        return {k: self._resolve(k) for k in keys}

    def _cleared(self, begin: bytes, end: bytes) -> list[ClearRange]:
        return [
            op
            for op in self._log
            if isinstance(op, ClearRange) and op.begin < end and begin < op.end
        ]

    def _resolve(self, key: bytes, snapshot: bool = False) -> bytes | None:
        resolved, value, pending = self._buffered(key)
        if resolved:
            return value
        stored = self._db_get(key, snapshot)
        return stored if pending is None else apply_adds(stored, pending)

    def _db_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if not snapshot and key in self._reads:
            return self._reads[key]
        conn = self._reader()
        try:
            row = conn.execute(SQL_GET, (key,)).fetchone()
            value = None if row is None else norm(row[0])
            if self._runs:
                value = fold_value(self._sqlite.run_cache, conn, self._runs, key, value)
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        if not snapshot:
            self._reads[key] = value
        return value

    # -- raw reads ----------------------------------------------------------------------

    def _raw_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if not self._log:
            return self._db_get(key, snapshot)
        return self._resolve(key, snapshot)

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        if len(keys) <= FEW_KEYS:
            # A few unrelated keys (a fence's, an append's): a local store has no round
            # trip to save, and a cached one-key statement each costs less than building one.
            return [self._raw_get(key, snapshot) for key in keys]
        if not self._log:
            conn = self._reader()
            found = self._fetch_many(conn, keys, self._runs)
            values = [found.get(k) for k in keys]
            if not snapshot:
                self._reads.update(zip(keys, values, strict=True))
            return values
        buffered = [self._buffered(k) for k in keys]
        needed = [k for k, (resolved, _, _) in zip(keys, buffered, strict=True) if not resolved]
        conn = self._reader()
        found = self._fetch_many(conn, needed, self._runs)
        if not snapshot:
            self._reads.update((k, found.get(k)) for k in needed)
        out: list[bytes | None] = []
        for k, (resolved, value, pending) in zip(keys, buffered, strict=True):
            if resolved:
                out.append(value)
            else:
                stored = found.get(k)
                out.append(stored if pending is None else apply_adds(stored, pending))
        return out

    def _fetch_many(
        self, conn: sqlite3.Connection, keys: list[bytes], runs: list[RunInfo]
    ) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        unique = list(dict.fromkeys(keys))
        try:
            for start in range(0, len(unique), IN_CHUNK):
                chunk = unique[start : start + IN_CHUNK]
                sql = f"SELECT key, value FROM kv WHERE key IN ({','.join('?' * len(chunk))})"
                for k, v in conn.execute(sql, chunk):
                    found[k] = norm(v)
            if runs:
                fold_many(self._sqlite.run_cache, conn, runs, unique, found)
        except sqlite3.Error as exc:
            raise self._sqlite.error(exc) from exc
        return found

    def _stored_range(
        self,
        conn: sqlite3.Connection,
        runs: list[RunInfo],
        begin: bytes,
        end: bytes,
        reverse: bool,
        limit: int,
    ) -> Iterator[tuple[bytes, bytes]]:
        """The stored ``(key, value)`` pairs in ``[begin, end)`` (``limit``: at most so
        many, 0: all), runs folded in."""
        order = "DESC" if reverse else "ASC"
        sql = f"SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key {order}"
        overlapping = [info for info in runs if info.overlaps(begin, end)]
        if not overlapping:
            if limit:
                sql += " LIMIT ?"
            params = (begin, end, limit) if limit else (begin, end)
            return ((k, norm(v)) for k, v in conn.execute(sql, params))
        rows = [(k, norm(v)) for k, v in conn.execute(sql, (begin, end))]
        folded = fold_range(self._sqlite.run_cache, conn, overlapping, rows, begin, end)
        if reverse:
            folded.reverse()
        return iter(folded[:limit] if limit else folded)

    def _raw_get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[tuple[bytes, bytes]]:
        conn = self._reader()
        overlay = self._overlay(begin, end) if self._log else {}
        cleared = self._cleared(begin, end) if self._log else []
        buffered = sorted(overlay.items(), reverse=reverse)
        # What a conflict check compares at commit; a snapshot read is not checked.
        digest = None if snapshot else hashlib.blake2b(digest_size=16)
        out: list[tuple[bytes, bytes]] = []
        full = False
        bi = 0

        def before(a: bytes, b: bytes) -> bool:
            return a > b if reverse else a < b

        try:
            rows = self._stored_range(
                conn, self._runs, begin, end, reverse, limit if not overlay and not cleared else 0
            )
            for k, v in rows:
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
                if digest is not None:
                    _digest_row(digest, k, v)
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
        if digest is not None:
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
        if not isinstance(last, PointOps):
            last = PointOps()
            self._log.append(last)
        last.ops[key] = compose(last.ops.get(key), kind, payload)

    def _raw_set(self, key: bytes, value: bytes) -> None:
        self._point(key, SET, value)

    def _raw_clear(self, key: bytes) -> None:
        self._point(key, CLEAR, None)

    def _raw_add(self, key: bytes, delta: int) -> None:
        self._point(key, ADD, delta)

    def _raw_set_many(self, keys: list[bytes], values: list[bytes]) -> None:
        if keys:
            self._log.append(BatchSet(keys, values))

    def _raw_add_many(self, keys: Sequence[bytes], deltas: list[int]) -> None:
        if keys:
            self._log.append(BatchAdd(keys, deltas))

    def _raw_add_lanes(self, keys: Sequence[bytes], deltas: list[bytes]) -> None:
        if keys:
            self._log.append(BatchAdd(keys, deltas))

    def _raw_clear_range(self, begin: bytes, end: bytes) -> None:
        self._log.append(ClearRange(begin, end))

    # -- commit -------------------------------------------------------------------------

    def _validate(self, conn: sqlite3.Connection, runs: list[RunInfo]) -> None:
        if self._reads:
            current = self._fetch_many(conn, list(self._reads), runs)
            for key, seen in self._reads.items():
                if current.get(key) != seen:
                    raise StoreConflictError(
                        f"key {key[:64]!r} changed after this transaction read it; retry "
                        "the transaction (Store.transact does so)"
                    )
        for begin, end, reverse, seen_digest in self._ranges:
            digest = hashlib.blake2b(digest_size=16)
            for k, v in self._stored_range(conn, runs, begin, end, reverse, 0):
                _digest_row(digest, k, v)
            if digest.digest() != seen_digest:
                raise StoreConflictError(
                    f"keys in [{begin[:64]!r}, {end[:64]!r}) changed after this transaction "
                    "read them; retry the transaction (Store.transact does so)"
                )

    def _encoded_runs(self) -> dict[int, EncodedRun | None]:
        """The runs this commit's ``add_many`` batches become (:func:`run_stretches`),
        sorted and encoded before the write lock is taken: by the ``id`` of each batch of
        a stretch, its run for the first and None for the others (in it already)."""
        encoded: dict[int, EncodedRun | None] = {}
        for stretch in run_stretches(self._log, self._sqlite.run_min_keys):
            runs = [Run.of_batch(op.keys, op.deltas) for op in stretch]
            run = runs[0] if len(runs) == 1 else Run.merge(runs)
            encoded |= dict.fromkeys(map(id, stretch[1:]))
            encoded[id(stretch[0])] = EncodedRun.of_run(run)
        return encoded

    def _apply(
        self, conn: sqlite3.Connection, runs: RunWriter, encoded: dict[int, EncodedRun | None]
    ) -> None:
        for op in self._log:
            if id(op) in encoded:
                run = encoded[id(op)]
                if run is not None:
                    runs.add(run)
                continue
            if runs.runs and self._before_runs(op, runs):
                runs.flush()
            if isinstance(op, PointOps):
                sets = [(k, p) for k, (kind, p) in op.ops.items() if kind == SET]
                clears = [(k,) for k, (kind, _) in op.ops.items() if kind == CLEAR]
                adds = [(k, p) for k, (kind, p) in op.ops.items() if kind == ADD]
                if clears:
                    conn.executemany(SQL_CLEAR, clears)
                if sets:
                    conn.executemany(SQL_SET, sets)
                if adds:
                    conn.executemany(SQL_ADD, adds)
            elif isinstance(op, ClearRange):
                conn.execute(SQL_CLEAR_RANGE, (op.begin, op.end))
            elif isinstance(op, BatchSet):
                conn.executemany(SQL_SET, zip(op.keys, op.values, strict=True))
            else:
                sql = SQL_ADD_LANES if op.lanes else SQL_ADD
                conn.executemany(sql, zip(op.keys, op.deltas, strict=True))

    @staticmethod
    def _before_runs(op: Op, runs: RunWriter) -> bool:
        """Whether ``op`` must come after the runs: it writes a key a run holds and does
        not commute with the run's adds (see :meth:`RunWriter.needs_flush`)."""
        if isinstance(op, ClearRange):
            return runs.overlaps(op.begin, op.end)
        if isinstance(op, PointOps):
            return runs.needs_flush(op.ops, lambda k: 1 if op.ops[k][0] == ADD else 0)
        if isinstance(op, BatchSet):
            return runs.needs_flush(op.keys, lambda k: 0)
        return runs.needs_flush(op.keys, lambda k: op.width)

    def _raw_commit(self) -> None:
        if not self._log:
            self._release(rollback=False)
            self._clear_state()
            return
        if self._conn is not None:
            self._release(rollback=False)
        encoded = self._encoded_runs()
        conn = self._sqlite.checkout()
        try:
            begin_transaction(conn, ("BEGIN IMMEDIATE",), self._sqlite.busy_timeout_ms)
            try:
                runs = list_runs(conn)
                self._validate(conn, runs)
                writer = RunWriter(conn, self._sqlite.run_cache, runs)
                self._apply(conn, writer, encoded)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            writer.committed()
            if writer.added and merge_due(writer.runs, self._sqlite.run_min_keys):
                self._sqlite.merger.request()
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
