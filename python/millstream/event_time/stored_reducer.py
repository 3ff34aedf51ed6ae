"""The event-time aggregation's stored reducer: merges partials of open panes, kept in
the store, follows the watermark, emits each pane once when it closes.

State, kept in memory and written in every commit (in the output keyspace, so it commits
with the reducer's indices or not at all; layout in :mod:`millstream.event_time.store_layout`):
the partials of open panes under their keys' key groups (only the keys a batch changed are
written, and a pane's keys are cleared when it is emitted), and under the reducer's index
its watermarks (the latest event time reported from each input partition; every reducer
gets every watermark row), the watermark panes were last closed at, the partials' schema
and the late rows (:mod:`millstream.event_time.late`).

The memory copy is the store's as of the last commit: after a commit that failed, or one
whose outcome is unknown, it is read again from the store before the next batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Reducer, Transaction
from millstream.event_time import store_layout
from millstream.event_time.aggregation import UsesPanes
from millstream.event_time.combiner import PARTITION, WATERMARK
from millstream.event_time.late import LateRows
from millstream.event_time.partials import START, Plan, finish, merge
from millstream.event_time.store_layout import own_key, partials_key
from millstream.event_time.watermark import END_OF_TIME, IdlePartitions, watermark
from millstream.exceptions import ConfigurationError
from millstream.state.keys import pack

_NO_TIME = -(2**63)


class _State:
    """Open panes' partials, the partitions' watermarks, the watermark panes were last
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


class PaneReducer(Reducer, UsesPanes):
    """Merges the partials of :class:`~millstream.event_time.PaneMapper` per pane and key
    and emits every pane once, when the watermark passes its end by the lateness (or when
    the processor drains), to the output ``Panes.output`` names.

    The watermark is the smallest, over the input partitions that may still send rows, of
    the latest event time read from each: a partition that has sent nothing yet, or whose
    mapper is down, holds every pane open until it reports (as in Flink, an idle input
    holds the watermark) or, with ``Panes.idle_timeout``, until it has been idle that
    long (:mod:`millstream.event_time.watermark`); a partition that drained (its input
    ended and every reducer committed its rows) no longer counts. Rows for a pane
    already emitted are late (:mod:`millstream.event_time.late`).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._state: _State | None = None
        self._pending: _State | None = None
        self._late = LateRows(self.spec.index)
        self._idle: IdlePartitions | None = None

    def _space(self, *rest: object) -> tuple[object, ...]:
        return own_key(self.spec.index, *rest)

    # -- the store copy ----------------------------------------------------------------------

    def _load(self, txn: Transaction, plan: Plan) -> _State:
        marks = store_layout.read_marks(txn, self._space("watermarks"))
        closed = store_layout.read_int(txn, self._space("closed"))
        schema = store_layout.read_schema(txn, self.spec.index)
        if schema is None:
            return _State(None, marks, None, closed)
        groups = [partials_key(g) for g in self.spec.key_group_range]
        open_ = store_layout.read(txn, groups, plan, schema)
        # An earlier layout kept the partials under the reducer's index: move them.
        legacy = store_layout.read(txn, [self._space("partial")], plan, schema)
        if legacy.num_rows:
            txn.clear_prefix(self._space("partial"))
            store_layout.write(txn, legacy, plan, self.spec.key_groups)
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
        table = pa.Table.from_batches([batch])
        self._advance(txn, table, table.schema.field(WATERMARK).type)

    def timer_due(self) -> bool:
        """Whether an idle partition's timeout ran out since the watermark was last
        computed (:meth:`IdlePartitions.due`), or that computation's commit was not
        confirmed: the watermark may close panes with no new row."""
        if self._idle is None or self.panes.idle_seconds is None:
            return False
        return self._pending is not None or self._idle.due()

    def on_timer(self, txn: Transaction) -> None:
        """Compute the watermark again with no new row, and close the panes it passes."""
        state = self._current(txn, Plan.of(self.panes))
        if state.kind is not None:
            self._advance(txn, None, state.kind)

    def _advance(self, txn: Transaction, table: pa.Table | None, kind: pa.DataType) -> None:
        """Fold ``table``'s partials and watermark rows (None: no rows) into the state,
        and emit the panes the watermark closes."""
        panes = self.panes
        plan = Plan.of(panes)
        state = self._current(txn, plan)
        self._late.begin(txn)
        if table is None:
            marks_rows = partials = None
        else:
            is_mark = pc.is_valid(table[PARTITION])
            marks_rows = table.filter(is_mark)
            partials = table.filter(pc.invert(is_mark))
        kind = state.kind or kind
        size, _, lateness = panes.ticks(kind)
        # Panes closed so far are exactly those the last committed close passed.
        closed_before = state.closed
        if closed_before is not None and partials is not None and partials.num_rows:
            keep = pc.greater(pc.add(partials[START], size + lateness), closed_before)
            if not pc.all(keep).as_py():
                self._late.count(txn, partials.filter(pc.invert(keep)), panes, plan, kind)
                partials = partials.filter(keep)
        if partials is not None:
            partials = partials.select([START, plan.key, *plan.names])
        marks = dict(state.marks)
        if marks_rows is not None and marks_rows.num_rows:
            got = marks_rows.group_by(PARTITION, use_threads=False).aggregate([(WATERMARK, "max")])
            for p, t in zip(
                got[PARTITION].to_pylist(),
                pc.cast(got[f"{WATERMARK}_max"], pa.int64()).to_pylist(),
                strict=True,
            ):
                marks[int(p)] = max(marks.get(int(p), _NO_TIME), int(t))
        parts = [p for p in (state.open, partials) if p is not None and p.num_rows]
        merged = merge(parts, plan) if parts else partials if partials is not None else state.open
        assert merged is not None  # a state with a kind has its open panes (maybe none)
        watermark = self._watermark(marks)
        if watermark is not None and state.closed is not None:
            watermark = max(watermark, state.closed)  # never reopens a closed pane
        if watermark is None:
            watermark = state.closed
        if watermark is not None and merged.num_rows:
            closing = pc.less_equal(pc.add(merged[START], size + lateness), watermark)
        else:
            closing = pa.array(np.zeros(merged.num_rows, dtype=bool))
        done = merged.filter(closing)
        still_open = merged.filter(pc.invert(closing))
        if done.num_rows:
            self._emit(txn, finish(done, panes, plan, kind))
            store_layout.clear(txn, done, plan, self.spec.key_groups)
        changed = still_open.slice(0, 0) if partials is None else still_open
        if partials is not None and partials.num_rows:
            touched = partials.select([START, plan.key])
            changed = still_open.join(
                touched.group_by([START, plan.key]).aggregate([]),
                [START, plan.key],
                join_type="inner",
            )
        store_layout.write(txn, changed, plan, self.spec.key_groups)
        if state.kind is None:
            schema = merged.schema.append(pa.field(WATERMARK, kind))
            txn.set(self._space("schema"), schema.serialize().to_pybytes())
        txn.set(self._space("watermarks"), store_layout.pack_marks(marks))
        if watermark is not None and watermark != state.closed:
            txn.set(self._space("closed"), pack((watermark,)))
        self._pending = _State(still_open, marks, kind, watermark)

    def _watermark(self, marks: dict[int, int]) -> int | None:
        """The watermark over the partitions that have not drained (None: unknown yet)."""
        if self._idle is None:
            self._idle = IdlePartitions(self.panes.idle_seconds)
        return watermark(marks, self.spec.num_partitions, self.drained_partitions, self._idle)

    @property
    def late_rows(self) -> int:
        """The late rows this reducer's commits counted, as of its last commit (0 before
        its first batch)."""
        return self._late.committed or 0

    def figures(self) -> Mapping[str, int]:
        """``late_rows``: the late rows this reducer's commits counted."""
        return self._late.figures()

    def _emit(self, txn: Transaction, results: pa.Table) -> None:
        txn.emit(self.panes.output, results)

    def on_commit(self) -> None:
        if self._pending is not None:
            self._state, self._pending = self._pending, None
        self._late.on_commit()

    @classmethod
    def on_rescale(cls, txn: Transaction, old_reducers: int, new_reducers: int) -> None:
        """Hand the old reducers' watermarks to the new ones
        (:func:`~millstream.event_time.store_layout.hand_over`); open panes' partials stay
        under their key groups.

        Raises:
            ConfigurationError: Partials are still stored per reducer (an earlier layout).
        """
        if any(txn.get_range(own_key(r, "partial"), limit=1) for r in range(old_reducers)):
            raise ConfigurationError(
                "this processor's pane partials are stored per reducer, as an earlier "
                "release kept them: start the processor once with this release (its "
                "reducers move them under their key groups), stop it, then rescale"
            )
        store_layout.hand_over(txn, old_reducers, new_reducers)

    def drain(self, txn: Transaction) -> None:
        """The end of input closes every pane still open."""
        panes = self.panes
        plan = Plan.of(panes)
        state = self._current(txn, plan)
        if state.open is not None and state.open.num_rows and state.kind is not None:
            self._emit(txn, finish(state.open, panes, plan, state.kind))
            for g in self.spec.key_group_range:
                txn.clear_prefix(partials_key(g))
        txn.set(self._space("closed"), pack((END_OF_TIME,)))
        self._pending = _State(
            None if state.open is None else state.open.slice(0, 0),
            state.marks,
            state.kind,
            END_OF_TIME,
        )
