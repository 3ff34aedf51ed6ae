"""Late rows: rows that reach a pane reducer for a pane it has already emitted.

A pane's output, once committed, never changes. A row that arrives afterwards for it
(behind the watermark by more than the lateness, or from a partition that was idle,
:mod:`millstream.event_time.idleness`) is late: counted in input rows (each pane it
belongs to counts it once, so a row of sliding panes may count several times), under the
reducer's own record ``("~windows", r, "late")`` in the same transaction as the batch
that brought it, so a batch replayed after a failure never counts twice; and, when
``Panes.late_output`` names an output, sent there in that transaction as the aggregates
it would have added (exactly once, as the panes are).

The pending reducer sees a row again until every row before it of its partition is
finished, so it tells a late row from one it has seen by position: the record ``("~windows",
r, "seen")`` keeps, per partition, how many of the rows its last commit left pending were
there when it closed panes (:func:`arrived_after_close`, :func:`seen_after`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.api import Transaction
from millstream.event_time.aggregation import Panes
from millstream.event_time.partials import Plan, finish, merge
from millstream.event_time.store_layout import own_key
from millstream.ledger import OUTPUT
from millstream.ledger.subspaces import processor_prefix
from millstream.queue_reducer import PendingRows
from millstream.state import open_store
from millstream.state.keys import decode_int64

FIGURE = "late_rows"
"""The status figure (and ``millstream_late_rows`` metric) of a reducer's late rows."""


def input_rows(partials: pa.Table, plan: Plan) -> int:
    """The input rows ``partials`` stand for (a partial without a row count, as rows
    spilled by an earlier release, counts as one)."""
    if plan.rows not in partials.column_names:
        return int(partials.num_rows)
    return int(pc.sum(partials[plan.rows]).as_py() or 0)


class LateRows:
    """A pane reducer's late rows: counted with the transaction, sent to the late output,
    and the total committed so far (what its status shows).

    Args:
        reducer: The reducer's index (its record's key).
    """

    def __init__(self, reducer: int) -> None:
        self._key = own_key(reducer, "late")
        self.committed: int | None = None
        self._counted = 0  # by the transaction under way, or one whose commit is unconfirmed

    def begin(self, txn: Transaction) -> None:
        """Before a transaction: read the committed total when it is not known (the first
        transaction, or the last one counted rows and its commit was not confirmed)."""
        if self.committed is None or self._counted:
            self.committed = txn.get_int(self._key)
            self._counted = 0

    def count(
        self, txn: Transaction, late: pa.Table, panes: Panes, plan: Plan, kind: pa.DataType
    ) -> None:
        """Count the input rows of the ``late`` partials in ``txn`` and send their
        aggregates to ``Panes.late_output`` (when set)."""
        if not late.num_rows:
            return
        rows = input_rows(late, plan)
        txn.add(self._key, rows)
        self._counted += rows
        if panes.late_output is not None:
            txn.emit(panes.late_output, finish(merge([late], plan), panes, plan, kind, user=False))

    def on_commit(self) -> None:
        """The transaction committed: its rows join the total."""
        if self.committed is not None:
            self.committed += self._counted
        self._counted = 0

    def figures(self) -> dict[str, int]:
        """``late_rows``: the committed total (nothing before the first transaction)."""
        return {} if self.committed is None else {FIGURE: self.committed}


def arrived_after_close(
    pending: PendingRows, closed: np.ndarray, seen: Mapping[int, int]
) -> np.ndarray:
    """Of the rows ``closed`` marks (partials of panes closed before this round), those
    that arrived after: past the first ``seen[p]`` pending rows of their partition ``p``."""
    late = np.zeros(len(closed), dtype=bool)
    for p, first, end in pending.runs:
        after = min(first + seen.get(p, 0), end)
        late[after:end] = closed[after:end]
    return late


def seen_after(pending: PendingRows, done: np.ndarray, seen: Mapping[int, int]) -> dict[int, int]:
    """The ``seen`` record once this round commits: per partition, how many of the rows
    left pending (after its finished prefix) this round saw with their pane closed
    (``done``), or an earlier one did."""
    prefix = pending.finished_prefix()
    out = {p: n for p, n in seen.items() if n > 0}
    for p, first, end in pending.runs:
        finished = prefix.get(p, 0)
        left = np.flatnonzero(done[first + finished : end])
        count = max(seen.get(p, 0) - finished, int(left[-1]) + 1 if left.size else 0)
        if count > 0:
            out[p] = count
        else:
            out.pop(p, None)
    return out


class _Job(Protocol):
    """What :func:`late_rows` reads of a processor: where its store is, and its reducers."""

    @property
    def store(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def num_reducers(self) -> int: ...


def late_rows(processor: _Job) -> int:
    """Input rows the processor's pane reducers received for panes already emitted
    (committed: exact across restarts and replays)."""
    with (
        open_store(processor.store, prefix=processor_prefix(processor.name)) as store,
        store.read() as txn,
    ):
        raw = [txn.get((*OUTPUT, *own_key(r, "late"))) for r in range(processor.num_reducers)]
    return sum(decode_int64(value) for value in raw if value is not None)


__all__ = ["FIGURE", "LateRows", "arrived_after_close", "input_rows", "late_rows", "seen_after"]
