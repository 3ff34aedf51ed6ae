"""The event-time store layout: open panes' partials, addressed by key group, and the
records a pane reducer keeps under its own index.

Layout, in the output keyspace (the ``~windows`` prefix is the one earlier releases wrote,
kept so that their stores still read):

- ``("~windows", "partial", g, pane_start, key)``: the partials of an open pane, as one
  fixed-width value (:func:`~millstream.event_time.partials.encode`), under the key's key group
  ``g``. A reducer reads and writes only the key groups it owns, so a rescale, which hands
  whole key groups to other reducers, moves none of them;
- ``("~windows", r, what)``: reducer ``r``'s own records (watermarks, the watermark panes
  were last closed at, the partials' schema, late rows and the pending rows seen,
  :mod:`millstream.event_time.late`, panes with stored partials); :func:`hand_over`
  gives the new reducers theirs when a rescale changes the count (the pending rows seen
  are finished by then: that record goes).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from millstream.api import Transaction
from millstream.event_time.combiner import WATERMARK
from millstream.event_time.partials import START, Plan, decode, encode
from millstream.key_groups import key_groups_of
from millstream.state.keys import pack, unpack

NO_TIME = -(2**63)


def partials_key(*rest: object) -> tuple[object, ...]:
    """Where open panes' partials are: ``(g, pane_start, key)`` follow."""
    return ("~windows", "partial", *rest)


def own_key(reducer: int, *rest: object) -> tuple[object, ...]:
    """Reducer ``reducer``'s own records."""
    return ("~windows", reducer, *rest)


def read_int(txn: Transaction, key: tuple[object, ...]) -> int | None:
    """A packed integer record (None: absent)."""
    raw = txn.get(key)
    return None if raw is None else int(unpack(raw)[0])


def read_marks(txn: Transaction, key: tuple[object, ...]) -> dict[int, int]:
    """A packed ``partition: latest event time`` record."""
    raw = txn.get(key)
    values = () if raw is None else unpack(raw)
    return {int(p): int(t) for p, t in zip(values[::2], values[1::2], strict=True)}


def pack_marks(marks: dict[int, int]) -> bytes:
    """The record :func:`read_marks` reads."""
    return pack(tuple(v for p in sorted(marks) for v in (p, marks[p])))


def read_stored_panes(txn: Transaction, reducer: int) -> set[int]:
    """The panes (their starts) with partials a rescale stored, as reducer
    ``reducer``'s list has them."""
    raw = txn.get(own_key(reducer, "stored"))
    return {int(s) for s in (() if raw is None else unpack(raw))}


def write_stored_panes(txn: Transaction, reducer: int, starts: set[int]) -> None:
    """Reducer ``reducer``'s list of panes with stored partials (cleared when empty)."""
    if starts:
        txn.set(own_key(reducer, "stored"), pack(tuple(sorted(starts))))
    else:
        txn.clear(own_key(reducer, "stored"))


def runs(
    table: pa.Table, plan: Plan, key_groups: int
) -> tuple[pa.Table, list[tuple[int, int, int, int]]]:
    """``table`` ordered by key group and pane, and its runs: ``(g, pane start, first
    row, end)``."""
    groups = key_groups_of(table, plan.key, key_groups)
    starts = np.asarray(table[START].to_numpy(), dtype=np.int64)
    order = np.lexsort((starts, groups))
    groups, starts = groups[order], starts[order]
    edges = np.flatnonzero((np.diff(groups) != 0) | (np.diff(starts) != 0)) + 1
    firsts = [0, *edges.tolist()]
    ends = [*edges.tolist(), len(groups)]
    found = [(int(groups[a]), int(starts[a]), a, b) for a, b in zip(firsts, ends, strict=True)]
    return table.take(pa.array(order)), found


def write(txn: Transaction, table: pa.Table, plan: Plan, key_groups: int) -> None:
    """Store the partials of ``table`` (replacing those of the same pane and key)."""
    if not table.num_rows:
        return
    ordered, found = runs(table, plan, key_groups)
    keys = ordered[plan.key].combine_chunks()
    values = encode(ordered, plan)
    for g, start, a, b in found:
        txn.set_many(partials_key(g, start), keys.slice(a, b - a), values.slice(a, b - a))


def clear(txn: Transaction, table: pa.Table, plan: Plan, key_groups: int) -> None:
    """Delete the stored partials of ``table``'s panes, for the key groups it has rows
    of (each key group's pane at once)."""
    if table.num_rows:
        for g, start, _, _ in runs(table, plan, key_groups)[1]:
            txn.clear_prefix(partials_key(g, start))


def read(
    txn: Transaction,
    prefixes: Iterable[tuple[object, ...]],
    plan: Plan,
    schema: pa.Schema,
) -> pa.Table:
    """The partials stored under ``prefixes`` (each a :func:`partials_key` or a legacy
    per-reducer prefix ending before the pane start), as a table of the partial
    ``schema`` (with the :data:`WATERMARK` field, which it drops)."""
    partial_schema = pa.schema([f for f in schema if f.name != WATERMARK])
    rows = [row for prefix in prefixes for row in txn.get_range(prefix)]
    if not rows:
        return partial_schema.empty_table()
    starts = pa.array([int(key[-2]) for key, _ in rows], pa.int64())
    keys = pa.array([key[-1] for key, _ in rows], partial_schema.field(plan.key).type)
    columns = {START: starts, plan.key: keys, **decode([v for _, v in rows], schema, plan)}
    return pa.table(columns, schema=partial_schema)


def read_schema(txn: Transaction, reducer: int) -> pa.Schema | None:
    """The partials' schema reducer ``reducer`` recorded (with the watermark's field, whose
    type is the time column's), or None before its first partials."""
    raw = txn.get(own_key(reducer, "schema"))
    return None if raw is None else pa.ipc.read_schema(pa.py_buffer(raw))


def hand_over(txn: Transaction, old_reducers: int, new_reducers: int) -> None:
    """Give every new reducer the records the old ones kept under their indices: per
    input partition the smallest watermark (which every old reducer had reached), the
    latest watermark any of them closed panes at (a pane one of them emitted stays
    emitted), the partials' schema, and every pane with stored partials; late-row counts go
    to reducer 0 (the record of pending rows seen goes: every row is finished at a
    rescale). Partials stay where they are, under their key groups."""
    marks: dict[int, int] = {}
    closed: int | None = None
    schema: bytes | None = None
    stored: set[int] = set()
    late = 0
    for r in range(old_reducers):
        for p, t in read_marks(txn, own_key(r, "watermarks")).items():
            marks[p] = min(marks.get(p, t), t)
        last = read_int(txn, own_key(r, "closed"))
        if last is not None:
            closed = max(last, NO_TIME if closed is None else closed)
        schema = schema or txn.get(own_key(r, "schema"))
        stored.update(read_stored_panes(txn, r))
        late += txn.get_int(own_key(r, "late"))
        txn.clear_prefix(own_key(r))
    for r in range(new_reducers):
        if marks:
            txn.set(own_key(r, "watermarks"), pack_marks(marks))
        if closed is not None:
            txn.set(own_key(r, "closed"), pack((closed,)))
        if schema is not None:
            txn.set(own_key(r, "schema"), schema)
        write_stored_panes(txn, r, stored)
    if late:
        txn.add(own_key(0, "late"), late)
