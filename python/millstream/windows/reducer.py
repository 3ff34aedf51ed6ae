"""The windowed aggregation's reducer: merges partials of open windows, follows the
watermark, emits each window once when it closes.

State, kept in memory and written in every commit (in the output keyspace, so it commits
with the reducer's indices or not at all; layout in :mod:`millstream.windows.stored`): the
partials of open windows under their keys' key groups (only the keys a batch changed are
written, and a window's keys are cleared when it is emitted), and under the reducer's
index its watermarks (the latest event time each mapper reported; every reducer gets
every watermark row), the watermark windows were last closed at, the partials' schema and
the rows dropped because their window had been emitted.

The memory copy is the store's as of the last commit: after a commit that failed, or one
whose outcome is unknown, it is read again from the store before the next batch.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Reducer, Transaction
from millstream.exceptions import ConfigurationError
from millstream.ledger import OUTPUT
from millstream.ledger.subspaces import processor_prefix
from millstream.state import open_store
from millstream.state.keys import decode_int64, pack
from millstream.windows import stored
from millstream.windows.mapper import MAPPER, WATERMARK
from millstream.windows.partials import START, Plan, finish, merge
from millstream.windows.spec import UsesWindows
from millstream.windows.stored import own_key, partials_key

_NO_TIME = -(2**63)
_END_OF_TIME = 2**62
"""The watermark once every mapper drained: past every window (and still adds safely)."""


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
        return own_key(self.spec.index, *rest)

    # -- the store copy ----------------------------------------------------------------------

    def _load(self, txn: Transaction, plan: Plan) -> _State:
        marks = stored.read_marks(txn, self._space("watermarks"))
        closed = stored.read_int(txn, self._space("closed"))
        schema = stored.read_schema(txn, self.spec.index)
        if schema is None:
            return _State(None, marks, None, closed)
        groups = [partials_key(g) for g in self.spec.key_group_range]
        open_ = stored.read(txn, groups, plan, schema)
        # An earlier layout kept the partials under the reducer's index: move them.
        legacy = stored.read(txn, [self._space("partial")], plan, schema)
        if legacy.num_rows:
            txn.clear_prefix(self._space("partial"))
            stored.write(txn, legacy, plan, self.spec.key_groups)
            open_ = pa.concat_tables([open_, legacy])
        return _State(open_, marks, schema.field(WATERMARK).type, closed)

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
            stored.clear(txn, done, plan, self.spec.key_groups)
        changed = still_open
        if partials.num_rows:
            touched = partials.select([START, plan.key])
            changed = still_open.join(
                touched.group_by([START, plan.key]).aggregate([]),
                [START, plan.key],
                join_type="inner",
            )
        stored.write(txn, changed, plan, self.spec.key_groups)
        if state.kind is None:
            schema = merged.schema.append(pa.field(WATERMARK, kind))
            txn.set(self._space("schema"), schema.serialize().to_pybytes())
        txn.set(self._space("watermarks"), stored.pack_marks(marks))
        if late:
            txn.add(self._space("late"), late)
        if watermark is not None and watermark != state.closed:
            txn.set(self._space("closed"), pack((watermark,)))
        self._pending = _State(still_open, marks, kind, watermark)
        self.late_rows += late

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
        """Hand the old reducers' watermarks to the new ones
        (:func:`~millstream.windows.stored.hand_over`); open windows' partials stay under
        their key groups.

        Raises:
            ConfigurationError: Partials are still stored per reducer (an earlier layout).
        """
        if any(txn.get_range(own_key(r, "partial"), limit=1) for r in range(old_reducers)):
            raise ConfigurationError(
                "this processor's window partials are stored per reducer, as an earlier "
                "release kept them: start the processor once with this release (its "
                "reducers move them under their key groups), stop it, then rescale"
            )
        stored.hand_over(txn, old_reducers, new_reducers)

    def drain(self, txn: Transaction) -> None:
        """The end of input closes every window still open."""
        windows = self.windows
        plan = Plan.of(windows)
        state = self._current(txn, plan)
        if state.open is not None and state.open.num_rows and state.kind is not None:
            self._emit(txn, finish(state.open, windows, plan, state.kind))
            for g in self.spec.key_group_range:
                txn.clear_prefix(partials_key(g))
        txn.set(self._space("closed"), pack((_END_OF_TIME,)))
        self._pending = _State(
            None if state.open is None else state.open.slice(0, 0),
            state.marks,
            state.kind,
            _END_OF_TIME,
        )


class _Job(Protocol):
    """What :func:`late_rows` reads of a processor: where its store is, and its reducers."""

    @property
    def store(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def num_reducers(self) -> int: ...


def late_rows(processor: _Job) -> int:
    """Rows the processor's window reducers dropped because their window had been emitted."""
    with (
        open_store(processor.store, prefix=processor_prefix(processor.name)) as store,
        store.read() as txn,
    ):
        raw = [txn.get((*OUTPUT, *own_key(r, "late"))) for r in range(processor.num_reducers)]
    return sum(decode_int64(value) for value in raw if value is not None)
