"""The fold cache: decoded runs kept by a store's transactions, and reads that fold them.

A key's value is its table value with the deltas of every run holding it added in the
runs' order (:mod:`millstream.state.sqlite.runs`); these are the reads that add them.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc

from millstream.state.keys import add_int64s
from millstream.state.sqlite.runs import SQL_RUN_DATA, Run, RunInfo


class RunCache:
    """Decoded runs by id, shared by a store's transactions.

    Only runs of committed snapshots enter it: a committed run never changes (a merge
    writes a new one) and its id is never given to another. A run a write transaction
    inserted is not committed until that transaction is, and SQLite gives the id of a
    rolled-back insert to the next run committed, so such runs enter only once their
    commit landed (:meth:`~millstream.state.sqlite.run_writer.RunWriter.committed`), and a
    merged run once its merge did. Each entry is also checked against the generation the
    table holds for the id.
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
        self.put(info, run)
        return run

    def put(self, info: RunInfo, run: Run) -> None:
        """Hold ``run``, committed under ``info`` (a run decoded, or one whose writing
        transaction committed: never one of a transaction that may still roll back)."""
        with self._lock:
            self._runs[info.id] = (info.generation, run)
            self._runs.move_to_end(info.id)
            while len(self._runs) > self._size:
                self._runs.popitem(last=False)


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
