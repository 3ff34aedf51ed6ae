"""Windowed aggregation on the persistent queue: open windows' partials stay pending.

:class:`PendingWindowReducer` is a :class:`~millstream.QueueReducer`: the partials of a
window that is still open are not written anywhere; they wait, pending, in the mappers'
windows (memory), and when the watermark closes the window the reducer merges them, emits
the result and finishes them in the same transaction. Besides the results, a commit writes
two small records under the reducer's own keys of the output keyspace:

- ``("~windows", r, "closed")``: the watermark windows were last closed at. A pending row
  of a window that closed (one that waited behind a row of an open window of the same
  mapper, or that came late) is finished without effect when seen again;
- ``("~windows", r, "watermarks")``: the latest event time each mapper reported, since the
  watermark rows that told it are finished.

A rescale (:func:`millstream.rescale`) ends the old reducers' run where every row up to
one point is finished: there the pending partials of open windows are merged and stored
under their keys' key groups (:mod:`millstream.windows.stored`), with
``("~windows", r, "stored")`` listing their windows; the key group's new owner merges them
into the window when it closes.

Compared with :class:`~millstream.windows.WindowReducer`, which writes the partials of
every open window a batch changes with every commit, this writes the results and nothing
else; the price is memory in the mappers: about one window (plus the lateness) of
partials, which must fit their windows' memory limit. Late rows are dropped, not counted.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Transaction
from millstream.queue_reducer import PendingRows, QueueReducer
from millstream.state.keys import pack
from millstream.windows import stored
from millstream.windows.mapper import MAPPER, WATERMARK
from millstream.windows.partials import START, Plan, finish, merge
from millstream.windows.spec import UsesWindows
from millstream.windows.stored import own_key, partials_key

_END_OF_TIME = 2**62
"""The watermark once every mapper's input ended: past every window."""


class PendingWindowReducer(QueueReducer, UsesWindows):
    """Emits every window of :class:`~millstream.windows.WindowMapper`'s partials once,
    when the watermark passes its end by the lateness, keeping open windows' partials
    pending instead of storing them.

    The watermark is the smallest, over the mappers whose input has not ended, of the
    latest event time each has reported: a mapper that has sent nothing yet, or is down,
    holds every window open (and its rows pending) until it reports.
    """

    def _space(self, *rest: object) -> tuple[object, ...]:
        return own_key(self.spec.index, *rest)

    def _read_stored(self, txn: Transaction, starts: list[int], plan: Plan) -> pa.Table | None:
        """The stored partials of windows ``starts`` in this reducer's key groups (None:
        there are none)."""
        schema = stored.read_schema(txn, self.spec.index)
        if schema is None or not starts:
            return None
        prefixes = [partials_key(g, s) for g in self.spec.key_group_range for s in starts]
        found = stored.read(txn, prefixes, plan, schema)
        return found if found.num_rows else None

    def _forget_stored(self, txn: Transaction, starts: list[int], kept: set[int]) -> None:
        """Delete the stored partials of windows ``starts`` (emitted); ``kept`` stay."""
        for g in self.spec.key_group_range:
            for s in starts:
                txn.clear_prefix(partials_key(g, s))
        stored.write_windows(txn, self.spec.index, kept)

    def process(self, pending: PendingRows, txn: Transaction) -> None:
        table = pending.rows
        if not table.num_rows:
            return
        windows = self.windows
        plan = Plan.of(windows)
        kind = table.schema.field(WATERMARK).type
        size, _, lateness = windows.ticks(kind)
        closed = stored.read_int(txn, self._space("closed"))
        reported = stored.read_marks(txn, self._space("watermarks"))
        is_mark = pc.is_valid(table[MAPPER]).combine_chunks()
        # Every row of a mapper before a pending watermark row is pending too (or finished),
        # so this round may go by them; only finished ones are stored (below).
        marks = _latest(table.filter(is_mark), reported)
        watermark = self._watermark(marks, pending.ended_mappers)
        if watermark is None or (closed is not None and watermark < closed):
            watermark = closed
        # A partial row is done once its window closed: now, or in an earlier round.
        ends = pc.add(table[START], size + lateness)
        if watermark is None:
            done = np.zeros(table.num_rows, dtype=bool)
        else:
            done = pc.fill_null(pc.less_equal(ends, watermark), False).to_numpy(
                zero_copy_only=False
            )
        fresh = done.copy()
        if closed is not None:
            fresh &= ~pc.fill_null(pc.less_equal(ends, closed), False).to_numpy(
                zero_copy_only=False
            )
        mask = done | is_mark.to_numpy(zero_copy_only=False)
        finished = pending.finish(mask)
        waiting = stored.read_windows(txn, self.spec.index)
        reached = sorted(
            s for s in waiting if watermark is not None and s + size + lateness <= watermark
        )
        if fresh.any() or reached:
            closing = [table.filter(pa.array(fresh)).drop_columns([MAPPER, WATERMARK])]
            earlier = self._read_stored(txn, reached, plan)
            if earlier is not None:
                closing.append(earlier)
            merged = merge(closing, plan)
            if merged.num_rows:
                txn.emit(windows.output, finish(merged, windows, plan, kind))
            if reached:
                self._forget_stored(txn, reached, waiting.difference(reached))
        if fresh.any() or reached or pc.any(finished).as_py():
            # A stored watermark is one of a finished row: every row of its mapper before it
            # is finished, so a new instance that has not fetched the pending rows yet
            # cannot go by a watermark of rows it has not seen.
            kept = _latest(table.filter(pc.and_(is_mark, finished)), reported)
            txn.set(self._space("watermarks"), stored.pack_marks(kept))
            if watermark is not None and watermark != closed:
                txn.set(self._space("closed"), pack((watermark,)))

    def hand_over(self, pending: PendingRows, txn: Transaction) -> None:
        """Store the pending partials of open windows under their key groups (merged with
        any a rescale stored before), with the watermarks and the windows they belong to,
        and finish every pending row."""
        table = pending.rows
        if table.num_rows:
            windows = self.windows
            plan = Plan.of(windows)
            kind = table.schema.field(WATERMARK).type
            size, _, lateness = windows.ticks(kind)
            closed = stored.read_int(txn, self._space("closed"))
            is_mark = pc.is_valid(table[MAPPER]).combine_chunks()
            marks = _latest(
                table.filter(is_mark), stored.read_marks(txn, self._space("watermarks"))
            )
            partials = table.filter(pc.invert(is_mark)).drop_columns([MAPPER, WATERMARK])
            if closed is not None and partials.num_rows:  # emitted already
                partials = partials.filter(
                    pc.greater(pc.add(partials[START], size + lateness), closed)
                )
            waiting = stored.read_windows(txn, self.spec.index)
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
                stored.write(txn, merge(parts, plan), plan, self.spec.key_groups)
                stored.write_windows(txn, self.spec.index, waiting | starts)
            txn.set(self._space("watermarks"), stored.pack_marks(marks))
        pending.finish_all()

    def drain(self, txn: Transaction) -> None:
        """The end of input: emit the windows whose partials a rescale stored and that
        closed with no pending row left to close them."""
        waiting = sorted(stored.read_windows(txn, self.spec.index))
        earlier = self._read_stored(txn, waiting, Plan.of(self.windows))
        if earlier is not None:
            schema = stored.read_schema(txn, self.spec.index)
            assert schema is not None  # _read_stored found it
            windows = self.windows
            kind = schema.field(WATERMARK).type
            txn.emit(windows.output, finish(earlier, windows, Plan.of(windows), kind))
        if waiting:
            self._forget_stored(txn, waiting, set())

    @classmethod
    def on_rescale(cls, txn: Transaction, old_reducers: int, new_reducers: int) -> None:
        """Hand the old reducers' watermarks and stored windows to the new ones
        (:func:`~millstream.windows.stored.hand_over`)."""
        stored.hand_over(txn, old_reducers, new_reducers)

    def _watermark(self, marks: dict[int, int], ended: frozenset[int]) -> int | None:
        """The smallest latest event time over the mappers whose input has not ended (None
        while one of them has reported nothing); past every window once all ended."""
        waiting = [m for m in range(self.spec.num_partitions) if m not in ended]
        if not waiting:
            return _END_OF_TIME
        if any(m not in marks for m in waiting):
            return None
        return min(marks[m] for m in waiting)


def _latest(reported: pa.Table, marks: dict[int, int]) -> dict[int, int]:
    """``marks`` (mapper: latest event time) updated with watermark rows ``reported``."""
    out = dict(marks)
    if not reported.num_rows:
        return out
    latest = reported.group_by(MAPPER, use_threads=False).aggregate([(WATERMARK, "max")])
    for m, t in zip(
        latest[MAPPER].to_pylist(),
        pc.cast(latest[f"{WATERMARK}_max"], pa.int64()).to_pylist(),
        strict=True,
    ):
        out[int(m)] = max(out.get(int(m), t), t)
    return out


__all__ = ["PendingWindowReducer"]
