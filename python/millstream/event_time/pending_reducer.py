"""The event-time aggregation on the persistent queue: open panes' partials stay pending.

:class:`PendingPaneReducer` is a :class:`~millstream.QueueReducer`: the partials of a
pane that is still open are not written anywhere; they wait, pending, in the mappers'
windows (memory), and when the watermark closes the pane the reducer merges them, emits
the result and finishes them in the same transaction. Besides the results, a commit writes
small records under the reducer's own keys of the output keyspace:

- ``("~windows", r, "closed")``: the watermark panes were last closed at. A pending row
  of a pane that closed is finished without effect when seen again (it waited behind a
  row of an open pane of the same partition), or counted as late (it came after);
- ``("~windows", r, "watermarks")``: the latest event time reported from each input
  partition, since the watermark rows that told it are finished;
- ``("~windows", r, "late")`` and ``("~windows", r, "seen")``: the late rows counted, and
  what tells them from rows seen again (:mod:`millstream.event_time.late`).

A rescale (:func:`millstream.rescale`) ends the old reducers' run where every row up to
one point is finished: there the pending partials of open panes are merged and stored
under their keys' key groups (:mod:`millstream.event_time.store_layout`), with
``("~windows", r, "stored")`` listing their panes; the key group's new owner merges them
into the pane when it closes.

Compared with :class:`~millstream.event_time.PaneReducer`, which writes the partials of
every open pane a batch changes with every commit, this writes the results and nothing
else; the price is memory in the mappers: about one pane (plus the lateness) of
partials, which must fit their windows' memory limit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Transaction
from millstream.event_time import store_layout
from millstream.event_time.aggregation import UsesPanes
from millstream.event_time.combiner import PARTITION, WATERMARK
from millstream.event_time.late import LateRows, arrived_after_close, seen_after
from millstream.event_time.partials import START, Plan, finish, merge
from millstream.event_time.store_layout import own_key, partials_key
from millstream.event_time.watermark import IdlePartitions, watermark
from millstream.queue_reducer import PendingRows, QueueReducer
from millstream.state.keys import pack


class PendingPaneReducer(QueueReducer, UsesPanes):
    """Emits every pane of :class:`~millstream.event_time.PaneMapper`'s partials once,
    when the watermark passes its end by the lateness, keeping open panes' partials
    pending instead of storing them.

    The watermark is the smallest, over the input partitions whose input has not ended,
    of the latest event time reported from each: a partition that has sent nothing yet,
    or whose mapper is down, holds every pane open (and its rows pending) until it
    reports, or, with ``Panes.idle_timeout``, until it has been idle that long
    (:mod:`millstream.event_time.watermark`). Rows for a pane already emitted are late
    (:mod:`millstream.event_time.late`).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._late = LateRows(self.spec.index)
        self._idle: IdlePartitions | None = None

    def _space(self, *rest: object) -> tuple[object, ...]:
        return own_key(self.spec.index, *rest)

    def _read_stored(self, txn: Transaction, starts: list[int], plan: Plan) -> pa.Table | None:
        """The stored partials of panes ``starts`` in this reducer's key groups (None:
        there are none)."""
        schema = store_layout.read_schema(txn, self.spec.index)
        if schema is None or not starts:
            return None
        prefixes = [partials_key(g, s) for g in self.spec.key_group_range for s in starts]
        found = store_layout.read(txn, prefixes, plan, schema)
        return found if found.num_rows else None

    def _forget_stored(self, txn: Transaction, starts: list[int], kept: set[int]) -> None:
        """Delete the stored partials of panes ``starts`` (emitted); ``kept`` stay."""
        for g in self.spec.key_group_range:
            for s in starts:
                txn.clear_prefix(partials_key(g, s))
        store_layout.write_stored_panes(txn, self.spec.index, kept)

    def process(self, pending: PendingRows, txn: Transaction) -> None:
        table = pending.rows
        if not table.num_rows:
            return
        panes = self.panes
        plan = Plan.of(panes)
        kind = table.schema.field(WATERMARK).type
        size, _, lateness = panes.ticks(kind)
        closed = store_layout.read_int(txn, self._space("closed"))
        reported = store_layout.read_marks(txn, self._space("watermarks"))
        seen = store_layout.read_marks(txn, self._space("seen"))
        self._late.begin(txn)
        is_mark = pc.is_valid(table[PARTITION]).combine_chunks()
        # Every row of a partition before a pending watermark row is pending too (or
        # finished), so this round may go by them; only finished ones are stored (below).
        marks = _latest(table.filter(is_mark), reported)
        watermark = self._watermark(marks, pending.ended_partitions)
        if watermark is None or (closed is not None and watermark < closed):
            watermark = closed
        # A partial row is done once its pane closed: now, or in an earlier round.
        ends = pc.add(table[START], size + lateness)
        if watermark is None:
            done = np.zeros(table.num_rows, dtype=bool)
        else:
            done = pc.fill_null(pc.less_equal(ends, watermark), False).to_numpy(
                zero_copy_only=False
            )
        fresh = done.copy()
        if closed is not None:
            before = pc.fill_null(pc.less_equal(ends, closed), False).to_numpy(zero_copy_only=False)
            fresh &= ~before
            self._count_late(txn, pending, before, seen, plan, kind)
        mask = done | is_mark.to_numpy(zero_copy_only=False)
        finished = pending.finish(mask)
        now_seen = seen_after(pending, done, seen)
        if now_seen != seen:
            txn.set(self._space("seen"), store_layout.pack_marks(now_seen))
        waiting = store_layout.read_stored_panes(txn, self.spec.index)
        reached = sorted(
            s for s in waiting if watermark is not None and s + size + lateness <= watermark
        )
        if fresh.any() or reached:
            closing = [table.filter(pa.array(fresh)).drop_columns([PARTITION, WATERMARK])]
            earlier = self._read_stored(txn, reached, plan)
            if earlier is not None:
                closing.append(earlier)
            merged = merge(closing, plan)
            if merged.num_rows:
                txn.emit(panes.output, finish(merged, panes, plan, kind))
            if reached:
                self._forget_stored(txn, reached, waiting.difference(reached))
        if fresh.any() or reached or pc.any(finished).as_py():
            # A stored watermark is one of a finished row: every row of its partition before
            # it is finished, so a new instance that has not fetched the pending rows yet
            # cannot go by a watermark of rows it has not seen.
            kept = _latest(table.filter(pc.and_(is_mark, finished)), reported)
            txn.set(self._space("watermarks"), store_layout.pack_marks(kept))
            if watermark is not None and watermark != closed:
                txn.set(self._space("closed"), pack((watermark,)))

    def timer_due(self) -> bool:
        """Whether an idle partition's timeout ran out since the watermark was last
        computed (:meth:`IdlePartitions.due`): ``process`` then runs over the pending rows
        with no new one, and closes the panes the watermark passes."""
        return self._idle is not None and self._idle.due()

    def _count_late(
        self,
        txn: Transaction,
        pending: PendingRows,
        closed: np.ndarray,
        seen: dict[int, int],
        plan: Plan,
        kind: pa.DataType,
    ) -> None:
        """Count the rows of panes ``closed`` before this round that were not pending
        when they closed (:func:`~millstream.event_time.late.arrived_after_close`)."""
        if closed.any():
            late = arrived_after_close(pending, closed, seen)
            if late.any():
                rows = pending.rows.filter(pa.array(late)).drop_columns([PARTITION, WATERMARK])
                self._late.count(txn, rows, self.panes, plan, kind)

    def figures(self) -> dict[str, int]:
        """``late_rows``: the late rows this reducer's commits counted."""
        return self._late.figures()

    def on_commit(self) -> None:
        self._late.on_commit()

    def hand_over(self, pending: PendingRows, txn: Transaction) -> None:
        """Store the pending partials of open panes under their key groups (merged with
        any a rescale stored before), with the watermarks and the panes they belong to,
        and finish every pending row."""
        table = pending.rows
        if table.num_rows:
            panes = self.panes
            plan = Plan.of(panes)
            kind = table.schema.field(WATERMARK).type
            size, _, lateness = panes.ticks(kind)
            closed = store_layout.read_int(txn, self._space("closed"))
            is_mark = pc.is_valid(table[PARTITION]).combine_chunks()
            marks = _latest(
                table.filter(is_mark), store_layout.read_marks(txn, self._space("watermarks"))
            )
            partials = table.filter(pc.invert(is_mark)).drop_columns([PARTITION, WATERMARK])
            if closed is not None and partials.num_rows:  # emitted already, or late
                self._late.begin(txn)
                ends = pc.add(table[START], size + lateness)
                before = pc.fill_null(pc.less_equal(ends, closed), False)
                seen = store_layout.read_marks(txn, self._space("seen"))
                self._count_late(
                    txn, pending, before.to_numpy(zero_copy_only=False), seen, plan, kind
                )
                partials = partials.filter(
                    pc.greater(pc.add(partials[START], size + lateness), closed)
                )
            partials = partials.select([START, plan.key, *plan.names])
            waiting = store_layout.read_stored_panes(txn, self.spec.index)
            if partials.num_rows:
                starts = set(pc.unique(partials[START]).to_pylist())
                txn.set(
                    self._space("schema"),
                    partials.schema.append(pa.field(WATERMARK, kind)).serialize().to_pybytes(),
                )
                parts = [partials]
                earlier = self._read_stored(txn, sorted(starts & waiting), plan)
                if earlier is not None:
                    parts.append(earlier)
                store_layout.write(txn, merge(parts, plan), plan, self.spec.key_groups)
                store_layout.write_stored_panes(txn, self.spec.index, waiting | starts)
            txn.set(self._space("watermarks"), store_layout.pack_marks(marks))
        pending.finish_all()

    def drain(self, txn: Transaction) -> None:
        """The end of input: emit the panes whose partials a rescale stored and that
        closed with no pending row left to close them."""
        waiting = sorted(store_layout.read_stored_panes(txn, self.spec.index))
        earlier = self._read_stored(txn, waiting, Plan.of(self.panes))
        if earlier is not None:
            schema = store_layout.read_schema(txn, self.spec.index)
            assert schema is not None  # _read_stored found it
            panes = self.panes
            kind = schema.field(WATERMARK).type
            txn.emit(panes.output, finish(earlier, panes, Plan.of(panes), kind))
        if waiting:
            self._forget_stored(txn, waiting, set())

    @classmethod
    def on_rescale(cls, txn: Transaction, old_reducers: int, new_reducers: int) -> None:
        """Hand the old reducers' watermarks and stored panes to the new ones
        (:func:`~millstream.event_time.store_layout.hand_over`)."""
        store_layout.hand_over(txn, old_reducers, new_reducers)

    def _watermark(self, marks: dict[int, int], ended: frozenset[int]) -> int | None:
        """The watermark over the partitions whose input has not ended (None: unknown yet)."""
        if self._idle is None:
            self._idle = IdlePartitions(self.panes.idle_seconds)
        return watermark(marks, self.spec.num_partitions, ended, self._idle)


def _latest(reported: pa.Table, marks: dict[int, int]) -> dict[int, int]:
    """``marks`` (partition: latest event time) updated with watermark rows ``reported``."""
    out = dict(marks)
    if not reported.num_rows:
        return out
    latest = reported.group_by(PARTITION, use_threads=False).aggregate([(WATERMARK, "max")])
    for p, t in zip(
        latest[PARTITION].to_pylist(),
        pc.cast(latest[f"{WATERMARK}_max"], pa.int64()).to_pylist(),
        strict=True,
    ):
        out[int(p)] = max(out.get(int(p), t), t)
    return out


__all__ = ["PendingPaneReducer"]
