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

Compared with :class:`~millstream.windows.WindowReducer`, which writes the partials of
every open window a batch changes with every commit, this writes the results and nothing
else; the price is memory in the mappers: about one window (plus the lateness) of
partials, which must fit their windows' memory limit. Late rows are dropped, not counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Transaction
from millstream.queue_reducer import PendingRows, QueueReducer
from millstream.state.keys import pack, unpack
from millstream.windows.mapper import MAPPER, WATERMARK
from millstream.windows.partials import START, Plan, finish, merge
from millstream.windows.spec import UsesWindows

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
        return ("~windows", self.spec.index, *rest)

    def process(self, pending: PendingRows, txn: Transaction) -> None:
        table = pending.rows
        if not table.num_rows:
            return
        windows = self.windows
        plan = Plan.of(windows)
        kind = table.schema.field(WATERMARK).type
        size, _, lateness = windows.ticks(kind)
        raw = txn.get(self._space("closed"))
        closed = None if raw is None else int(unpack(raw)[0])
        raw = txn.get(self._space("watermarks"))
        stored = {} if raw is None else {int(m): int(t) for m, t in _pairs(unpack(raw))}
        is_mark = pc.is_valid(table[MAPPER]).combine_chunks()
        # Every row of a mapper before a pending watermark row is pending too (or finished),
        # so this round may go by them; only finished ones are stored (below).
        marks = _latest(table.filter(is_mark), stored)
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
        if fresh.any():
            closing = table.filter(pa.array(fresh)).drop_columns([MAPPER, WATERMARK])
            txn.emit(windows.output, finish(merge([closing], plan), windows, plan, kind))
        if fresh.any() or pc.any(finished).as_py():
            # A stored watermark is one of a finished row: every row of its mapper before it
            # is finished, so a new instance that has not fetched the pending rows yet
            # cannot go by a watermark of rows it has not seen.
            kept = _latest(table.filter(pc.and_(is_mark, finished)), stored)
            txn.set(
                self._space("watermarks"),
                pack(tuple(v for m in sorted(kept) for v in (m, kept[m]))),
            )
            if watermark is not None and watermark != closed:
                txn.set(self._space("closed"), pack((watermark,)))

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


def _pairs(values: tuple[Any, ...]) -> list[tuple[Any, Any]]:
    return list(zip(values[::2], values[1::2], strict=True))


__all__ = ["PendingWindowReducer"]
