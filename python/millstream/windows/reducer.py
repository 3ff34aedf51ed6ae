"""The windowed aggregation's reducer: merges partials of open windows, follows the
watermark, emits each window once when it closes.

State, kept in memory and written in every commit (in the output keyspace, so it commits
with the reducer's indices or not at all):

- ``("~windows", "partial", g, window_start, key)``: the partials of an open window, as one
  fixed-width value (:func:`~millstream.windows.partials.encode`), under the key's key group
  ``g``: a reducer reads and writes only its own key groups, and a rescale, which hands
  whole key groups to other reducers, moves none of them. Only the keys a batch changed
  are written, and a window's keys are cleared when it is emitted;
- ``("~windows", r, "watermarks")``: the latest event time each mapper reported (reducer
  ``r``'s own: every reducer gets every watermark row);
- ``("~windows", r, "closed")``: the watermark windows were last closed at;
- ``("~windows", r, "schema")``: the partial table's schema and the time column's type;
- ``("~windows", r, "late")``: rows dropped because their window had been emitted.

The memory copy is the store's as of the last commit: after a commit that failed, or one
whose outcome is unknown, it is read again from the store before the next batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Reducer, Transaction
from millstream.exceptions import ConfigurationError
from millstream.ledger import OUTPUT
from millstream.state.keys import decode_int64, pack, unpack
from millstream.windows.mapper import MAPPER, WATERMARK
from millstream.windows.partials import (
    START,
    Plan,
    decode,
    encode,
    finish,
    key_groups_of,
    merge,
)
from millstream.windows.spec import UsesWindows

if TYPE_CHECKING:
    from millstream.processor import Processor

_NO_TIME = -(2**63)
_END_OF_TIME = 2**62
"""The watermark once every mapper drained: past every window (and still adds safely)."""


def _partials(*rest: object) -> tuple[object, ...]:
    """Where open windows' partials are, by key group: ``(g, window_start, key)`` follow."""
    return ("~windows", "partial", *rest)


def _own(reducer: int, *rest: object) -> tuple[object, ...]:
    """Reducer ``reducer``'s own records."""
    return ("~windows", reducer, *rest)


class _State:
    """Open windows' partials, the mappers' watermarks, the watermark windows were last
    closed at (None: none closed yet) and the time column's type."""

    def __init__(
        self,
        open_: pa.Table | None,
        marks: dict[int, int],
        kind: pa.DataType | None,
        closed: int | None = None,
    ) -> None:
        self.open = open_
        self.marks = marks
        self.kind = kind
        self.closed = closed


class WindowReducer(Reducer, UsesWindows):
    """Merges the partials of :class:`~millstream.windows.WindowMapper` per window and key
    and emits every window once, when the watermark passes its end by the lateness (or
    when the processor drains), to the output ``Windows.output`` names.

    The watermark is the smallest, over the mappers that may still send rows, of the
    latest event time each has read: a mapper that has sent nothing yet, or is down, holds
    every window open until it reports (as in Flink, an idle input holds the watermark); a
    mapper that drained (its input ended and every reducer committed its rows) no longer
    counts.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._state: _State | None = None
        self._pending: _State | None = None
        self.late_rows = 0

    def _space(self, *rest: object) -> tuple[object, ...]:
        return _own(self.spec.index, *rest)

    # -- the store copy ----------------------------------------------------------------------

    def _load(self, txn: Transaction, plan: Plan) -> _State:
        raw = txn.get(self._space("watermarks"))
        marks = {} if raw is None else dict(zip(*[iter(unpack(raw))] * 2, strict=True))
        closed_raw = txn.get(self._space("closed"))
        closed = None if closed_raw is None else int(unpack(closed_raw)[0])
        schema_raw = txn.get(self._space("schema"))
        if schema_raw is None:
            return _State(None, {int(m): int(t) for m, t in marks.items()}, None, closed)
        schema = pa.ipc.read_schema(pa.py_buffer(schema_raw))
        kind = schema.field(WATERMARK).type
        partial_schema = pa.schema([f for f in schema if f.name != WATERMARK])
        rows = [row for g in self.spec.key_group_range for row in txn.get_range(_partials(g))]
        # An earlier layout kept the partials under the reducer's index: move them.
        legacy = txn.get_range(self._space("partial"))
        rows += legacy
        if rows:
            starts = pa.array([int(key[-2]) for key, _ in rows], pa.int64())
            keys = pa.array([key[-1] for key, _ in rows], partial_schema.field(plan.key).type)
            columns = {START: starts, plan.key: keys, **decode([v for _, v in rows], schema, plan)}
            open_ = pa.table(columns, schema=partial_schema)
            if legacy:
                txn.clear_prefix(self._space("partial"))
                self._write_partials(txn, open_, plan)
        else:
            open_ = partial_schema.empty_table()
        return _State(open_, {int(m): int(t) for m, t in marks.items()}, kind, closed)

    def _current(self, txn: Transaction, plan: Plan) -> _State:
        """The state as of the last commit: the memory copy, or the store's when there is
        none yet or the last transaction's commit was not confirmed (it may have landed)."""
        if self._state is None or self._pending is not None:
            self._state = self._load(txn, plan)
            self._pending = None
        return self._state

    # -- reduce ------------------------------------------------------------------------------

    def reduce(self, batch: pa.RecordBatch, txn: Transaction) -> None:
        windows = self.windows
        plan = Plan.of(windows)
        state = self._current(txn, plan)
        table = pa.Table.from_batches([batch])
        is_mark = pc.is_valid(table[MAPPER])
        marks_rows = table.filter(is_mark)
        partials = table.filter(pc.invert(is_mark)).drop_columns([MAPPER, WATERMARK])
        kind = state.kind or table.schema.field(WATERMARK).type
        size, _, lateness = windows.ticks(kind)
        # Windows closed so far are exactly those the last committed close passed.
        closed_before = state.closed
        late = 0
        if closed_before is not None and partials.num_rows:
            ends = pc.add(partials[START], size + lateness)
            keep = pc.greater(ends, closed_before)
            late = partials.num_rows - pc.sum(keep).as_py() if partials.num_rows else 0
            partials = partials.filter(keep)
        marks = dict(state.marks)
        if marks_rows.num_rows:
            got = marks_rows.group_by(MAPPER, use_threads=False).aggregate([(WATERMARK, "max")])
            for m, t in zip(
                got[MAPPER].to_pylist(),
                pc.cast(got[f"{WATERMARK}_max"], pa.int64()).to_pylist(),
                strict=True,
            ):
                marks[int(m)] = max(marks.get(int(m), _NO_TIME), int(t))
        parts = [p for p in (state.open, partials) if p is not None and p.num_rows]
        merged = merge(parts, plan) if parts else partials
        watermark = self._watermark(marks)
        if watermark is not None and state.closed is not None:
            watermark = max(watermark, state.closed)  # never reopens a closed window
        if watermark is None:
            watermark = state.closed
        if watermark is not None and merged.num_rows:
            closing = pc.less_equal(pc.add(merged[START], size + lateness), watermark)
        else:
            closing = pa.array(np.zeros(merged.num_rows, dtype=bool))
        done = merged.filter(closing)
        still_open = merged.filter(pc.invert(closing))
        if done.num_rows:
            self._emit(txn, finish(done, windows, plan, kind))
            self._clear_partials(txn, done, plan)
        changed = still_open
        if partials.num_rows:
            touched = partials.select([START, plan.key])
            changed = still_open.join(
                touched.group_by([START, plan.key]).aggregate([]),
                [START, plan.key],
                join_type="inner",
            )
        self._write_partials(txn, changed, plan)
        if state.kind is None:
            schema = merged.schema.append(pa.field(WATERMARK, kind))
            txn.set(self._space("schema"), schema.serialize().to_pybytes())
        txn.set(
            self._space("watermarks"), pack(tuple(v for m in sorted(marks) for v in (m, marks[m])))
        )
        if late:
            txn.add(self._space("late"), late)
        if watermark is not None and watermark != state.closed:
            txn.set(self._space("closed"), pack((watermark,)))
        self._pending = _State(still_open, marks, kind, watermark)
        self.late_rows += late

    def _by_group(
        self, table: pa.Table, plan: Plan
    ) -> tuple[pa.Table, list[tuple[int, int, int, int]]]:
        """``table`` ordered by key group and window, and its runs: ``(g, window_start,
        first row, end)``."""
        groups = key_groups_of(table, plan, self.spec.key_groups)
        starts = np.asarray(table[START].to_numpy(), dtype=np.int64)
        order = np.lexsort((starts, groups))
        groups, starts = groups[order], starts[order]
        edges = np.flatnonzero((np.diff(groups) != 0) | (np.diff(starts) != 0)) + 1
        firsts = [0, *edges.tolist()]
        ends = [*edges.tolist(), len(groups)]
        runs = [(int(groups[a]), int(starts[a]), a, b) for a, b in zip(firsts, ends, strict=True)]
        return table.take(pa.array(order)), runs

    def _write_partials(self, txn: Transaction, table: pa.Table, plan: Plan) -> None:
        if not table.num_rows:
            return
        ordered, runs = self._by_group(table, plan)
        keys = ordered[plan.key].combine_chunks()
        values = encode(ordered, plan)
        for g, start, a, b in runs:
            txn.set_many(_partials(g, start), keys.slice(a, b - a), values.slice(a, b - a))

    def _clear_partials(self, txn: Transaction, table: pa.Table, plan: Plan) -> None:
        """Delete the stored partials of ``table``'s windows (each run of one key group
        and window at once)."""
        for g, start, _, _ in self._by_group(table, plan)[1]:
            txn.clear_prefix(_partials(g, start))

    def _watermark(self, marks: dict[int, int]) -> int | None:
        """The smallest latest event time over the mappers that may still send rows (None
        while one of them has reported nothing); past every window once all drained."""
        waiting = [m for m in range(self.spec.num_partitions) if m not in self.drained_mappers]
        if not waiting:
            return _END_OF_TIME
        if any(m not in marks for m in waiting):
            return None
        return min(marks[m] for m in waiting)

    def _emit(self, txn: Transaction, results: pa.Table) -> None:
        txn.emit(self.windows.output, results)

    def on_commit(self) -> None:
        if self._pending is not None:
            self._state, self._pending = self._pending, None

    @classmethod
    def on_rescale(cls, txn: Transaction, old_reducers: int, new_reducers: int) -> None:
        """Give every new reducer the watermarks the old ones had (per mapper the smallest,
        which every old reducer had reached) and the latest watermark any of them closed
        windows at (a window one of them emitted stays emitted); the late-row counts go to
        reducer 0. The partials stay where they are, under their key groups.

        Raises:
            ConfigurationError: Partials are still stored per reducer (an earlier layout).
        """
        if any(txn.get_range(_own(r, "partial"), limit=1) for r in range(old_reducers)):
            raise ConfigurationError(
                "this processor's window partials are stored per reducer, as an earlier "
                "release kept them: start the processor once with this release (its "
                "reducers move them under their key groups), stop it, then rescale"
            )
        marks: dict[int, int] = {}
        closed: int | None = None
        schema: bytes | None = None
        late = 0
        for r in range(old_reducers):
            raw = txn.get(_own(r, "watermarks"))
            pairs = () if raw is None else unpack(raw)
            for m, t in zip(pairs[::2], pairs[1::2], strict=True):
                marks[int(m)] = min(marks.get(int(m), int(t)), int(t))
            raw = txn.get(_own(r, "closed"))
            if raw is not None:
                closed = max(int(unpack(raw)[0]), _NO_TIME if closed is None else closed)
            schema = schema or txn.get(_own(r, "schema"))
            late += txn.get_int(_own(r, "late"))
            txn.clear_prefix(_own(r))
        for r in range(new_reducers):
            if marks:
                txn.set(
                    _own(r, "watermarks"),
                    pack(tuple(v for m in sorted(marks) for v in (m, marks[m]))),
                )
            if closed is not None:
                txn.set(_own(r, "closed"), pack((closed,)))
            if schema is not None:
                txn.set(_own(r, "schema"), schema)
        if late:
            txn.add(_own(0, "late"), late)

    def drain(self, txn: Transaction) -> None:
        """The end of input closes every window still open."""
        windows = self.windows
        plan = Plan.of(windows)
        state = self._current(txn, plan)
        if state.open is not None and state.open.num_rows and state.kind is not None:
            self._emit(txn, finish(state.open, windows, plan, state.kind))
            for g in self.spec.key_group_range:
                txn.clear_prefix(_partials(g))
        txn.set(self._space("closed"), pack((_END_OF_TIME,)))
        self._pending = _State(
            None if state.open is None else state.open.slice(0, 0),
            state.marks,
            state.kind,
            _END_OF_TIME,
        )


def late_rows(processor: Processor) -> int:
    """Rows the processor's window reducers dropped because their window had been emitted."""
    store = processor.open_store()
    try:
        with store.read() as txn:
            raw = [txn.get((*OUTPUT, *_own(r, "late"))) for r in range(processor.num_reducers)]
    finally:
        store.close()
    return sum(decode_int64(value) for value in raw if value is not None)
