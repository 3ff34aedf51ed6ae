"""The simulated job and what it must produce: the user's map and reducers (every row's
effect a counter keyed by its identity), the in-memory input, the simulation's time, and
:class:`Oracle`, the rows every mapper must produce, in shuffle order.

The user's map either sends each mapped row on its own or pre-aggregates a batch (one row
per reducer), so the shuffle numbering depends on where batches are cut, as with a real
combining map; :class:`Oracle` learns the cuts from the map calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import millstream as ms
import pyarrow as pa
from millstream.exceptions import InputError
from millstream.inputs.base import ReadResult

# -- the user's code: every row's effect is a counter keyed by its identity ------------

Item = tuple[int, int]
"""One mapped row's identity within its mapper: ``(input row, copy)``."""


Group = tuple[int, tuple[Item, ...]]
"""One shuffled row: its reducer and the mapped rows it carries."""


def fanout(mapper: int, row: int) -> int:
    """How many rows ``map`` makes of one input row: 0, 1 or 2 (0 exercises empty output)."""
    return (row * 7 + mapper * 3 + 1) % 3


def reducer_of(mapper: int, row: int, copy: int, num_reducers: int) -> int:
    """The reducer of one mapped row (deterministic, spread over reducers)."""
    return (mapper * 31 + row * 17 + copy * 5) % num_reducers


def map_rows(
    mapper: int, rows: Sequence[int], num_reducers: int, preaggregate: bool
) -> list[Group]:
    """What the user's map makes of one batch of input rows, in shuffle order.

    Row-wise: one shuffled row per mapped row. Pre-aggregating: one shuffled row per reducer
    (in order of first appearance) carrying all of the batch's rows for it, so the result
    depends on the batch's boundaries.
    """
    items = [
        (row, copy, reducer_of(mapper, row, copy, num_reducers))
        for row in rows
        for copy in range(fanout(mapper, row))
    ]
    if not preaggregate:
        return [(red, ((row, copy),)) for row, copy, red in items]
    groups: dict[int, list[Item]] = {}
    for row, copy, red in items:
        groups.setdefault(red, []).append((row, copy))
    return [(red, tuple(its)) for red, its in groups.items()]


COPIES = 4
"""Items travel as ``row * COPIES + copy``."""


class SimMapper(ms.Mapper):
    """A deterministic map; ``config["preaggregate"]`` picks the batch-dependent variant.

    ``config["observe"]``, if set, is told the input range of every batch mapped.
    """

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        rows = batch.column("row").to_pylist()
        mappers = set(batch.column("mapper").to_pylist())
        assert len(mappers) == 1
        assert rows == list(range(rows[0], rows[0] + len(rows)))
        m = mappers.pop()
        groups = map_rows(m, rows, self.spec.num_reducers, bool(self.config["preaggregate"]))
        observe = self.config.get("observe")
        if observe is not None:
            observe(m, rows[0], rows[-1] + 1)
        out = pa.record_batch(
            {
                "mapper": pa.array([m] * len(groups), pa.int64()),
                "items": pa.array(
                    [[row * COPIES + copy for row, copy in its] for _, its in groups],
                    pa.list_(pa.int64()),
                ),
                "pad": pa.array([f"payload-{its[0][0]}" for _, its in groups], pa.string()),
            }
        )
        return ms.Partitioned.with_indices(out, [red for red, _ in groups])


EFFECT = ("effect",)


EMITTED = "emitted"
"""The output queue every reducer appends its effects to (a pipeline's first stage)."""


class SimReducer(ms.Reducer):
    """Applies one counter increment per mapped row received, through the commit
    transaction, and appends the same effects to the output queue :data:`EMITTED`: the
    queue must hold every effect as often as its counter counts it."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        apply_effects(batch.column("mapper"), batch.column("items"), txn, self.config)


def apply_effects(
    mappers: pa.Array | pa.ChunkedArray,
    items: pa.Array | pa.ChunkedArray,
    txn: ms.Transaction,
    config: Any,
) -> None:
    """One counter increment per mapped row item (and the same effects to the output
    queue when ``config["emit"]``)."""
    emitted: list[int] = []
    for m, codes in zip(mappers.to_pylist(), items.to_pylist(), strict=True):
        for code in codes:
            txn.add((*EFFECT, m, code // COPIES, code % COPIES), 1)
            emitted.append(m * 1_000_000 + code)
    if config.get("emit"):
        txn.append(EMITTED, pa.table({"effect": pa.array(emitted, pa.int64())}))


class SimQueueReducer(ms.QueueReducer):
    """:class:`SimReducer` as a persistent-queue reducer: each round it marks about two
    pending rows in three finished (a deterministic function of the row and the round, so
    replays repeat it; all of them once every mapper's input ended) and applies the effects
    of the rows the commit finishes only. Rows left pending come again; a finished row's
    effect must be applied exactly once whatever fails."""

    def hand_over(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        """A rescale: every pending row's effect is applied now, by its old owner (what
        the rows stand for needs no new owner)."""
        pending.finish_all()
        apply_effects(pending.rows["mapper"], pending.rows["items"], txn, self.config)

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        rows = pending.rows
        if len(pending.ended_partitions) == self.spec.num_partitions:
            pending.finish_all()
        else:
            salt = len(pending)
            pending.finish(
                [
                    (m * 31 + (items[0] if items else 0) + salt) % 3 != 0
                    for m, items in zip(
                        rows.column("mapper").to_pylist(),
                        rows.column("items").to_pylist(),
                        strict=True,
                    )
                ]
            )
        done = rows.filter(pending.finished())
        apply_effects(done["mapper"], done["items"], txn, self.config)


# -- time ----------------------------------------------------------------------------


SIM_START = 1_000.0
"""Where the simulation's :class:`~millstream.testing.ManualClock` starts."""


SIM_WALL_OFFSET = 1_700_000_000.0
"""Its wall clock: this plus its monotonic time."""


# -- input ---------------------------------------------------------------------------


@dataclass
class SimPartition:
    """One input partition: ``total`` rows, of which ``visible`` were produced so far."""

    index: int
    total: int
    visible: int
    trimmed: int = 0
    unavailable: bool = False
    trims: list[int] = field(default_factory=list)
    stalls: deque[list[Any]] = field(default_factory=deque)

    def batch(self, begin: int, end: int) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "mapper": pa.array([self.index] * (end - begin), pa.int64()),
                "row": pa.array(range(begin, end), pa.int64()),
            }
        )


class TrimmedInputError(InputError):
    """A read below a partition's trim point: those rows are gone."""


class SimReader:
    """A reader of a :class:`SimPartition`; the continuation token is the next row, as text.

    Like a queue with deleted prefix, rows below the trim point are gone: a read that starts
    there raises :class:`TrimmedInputError`, as real inputs do. Reads may be slow: an entry
    ``[n, fn]`` of the partition's ``stalls`` lets ``n`` more reads pass, then ``fn`` runs
    while the next one waits (before it looks at the partition).
    """

    def __init__(self, partition: SimPartition) -> None:
        self.partition = partition

    def read(self, begin_row_index: int, end_row_index_hint: int, token: bytes) -> ReadResult:
        p = self.partition
        _stall_read(p)
        if p.unavailable:
            raise InputError(f"partition {p.index} is unavailable (simulated)")
        start = int(token or b"0")
        if start < p.trimmed:
            raise TrimmedInputError(
                f"partition {p.index}: rows below {p.trimmed} were trimmed; cannot read from "
                f"row {start} (simulated)"
            )
        end = min(start + max(1, end_row_index_hint - begin_row_index), p.visible)
        if end <= start:
            return ReadResult(None, str(start).encode(), p.visible == p.total == start)
        return ReadResult(p.batch(start, end), str(end).encode(), p.visible == p.total == end)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        p = self.partition
        p.trims.append(row_index)
        p.trimmed = max(p.trimmed, row_index)

    def close(self) -> None:
        pass


def _stall_read(p: SimPartition) -> None:
    """Input latency: run the steps armed for this read while it waits."""
    if not p.stalls:
        return
    entry = p.stalls[0]
    if entry[0] > 0:
        entry[0] -= 1
        return
    p.stalls.popleft()
    entry[1]()


class SimInput:
    """A processor input of in-memory partitions."""

    def __init__(self, partitions: list[SimPartition]) -> None:
        self.partitions = partitions

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    def reader(self, partition: int) -> SimReader:
        return SimReader(self.partitions[partition])


# -- the oracle --------------------------------------------------------------------------


class Oracle:
    """The rows every mapper must produce, in shuffle order.

    For a pre-aggregating map, the first map call at an input row fixes the batch starting
    there (the workers record batch boundaries before sending rows, so every later instance
    must cut the same way) and the shuffle numbering follows from the batches. Row by row,
    the numbering is known from the start.
    """

    def __init__(self, totals: Sequence[int], num_reducers: int, preaggregate: bool) -> None:
        self.totals = list(totals)
        self.num_reducers = num_reducers
        self.preaggregate = preaggregate
        # cuts[m][begin] = end of the batch of mapper m starting at input row begin
        self.cuts: list[dict[int, int]] = [{} for _ in totals]
        # shuffle_at[m][i] = shuffle index of the first row mapped from input row i, for
        # every batch boundary i
        self.shuffle_at: list[dict[int, int]] = [{0: 0} for _ in totals]
        # outputs[m][s] = the shuffled row of shuffle index s
        self.outputs: list[list[Group]] = [[] for _ in totals]
        self.end = [0 for _ in totals]
        self.recuts: list[str] = []
        self.rescaled_at = [0 for _ in totals]
        """Per mapper, the shuffle index the last rescale handed over at."""
        if not preaggregate:
            # Row by row, the numbering does not depend on the batches: every row is a
            # boundary.
            for m, total in enumerate(totals):
                for row in range(total):
                    self.outputs[m].extend(map_rows(m, [row], num_reducers, False))
                    self.shuffle_at[m][row + 1] = len(self.outputs[m])

    def observe(self, m: int, begin: int, end: int) -> None:
        """``map`` ran on input rows ``[begin, end)`` of mapper ``m``."""
        if not self.preaggregate:
            return
        if begin == self.end[m]:
            self.cuts[m][begin] = end
            self.outputs[m].extend(
                map_rows(m, range(begin, end), self.num_reducers, self.preaggregate)
            )
            self.shuffle_at[m][end] = len(self.outputs[m])
            self.end[m] = end
        elif self.cuts[m].get(begin) != end:
            self.recuts.append(
                f"mapper {m} mapped input rows [{begin}, {end}); the first batch there was "
                f"[{begin}, {self.cuts[m].get(begin)})"
            )

    def committed_effects(self, states: list[tuple[int, ...]]) -> set[tuple[int, int, int]]:
        """Effects implied by every reducer's committed indices: exactly those rows (and
        every row before the last rescale's cut, which the reducers then had committed)."""
        out = set()
        for m, base in enumerate(self.rescaled_at):
            out.update(self.effects_before(m, base))
        for r, committed in enumerate(states):
            for m, last in enumerate(committed):
                for red, items in self.outputs[m][self.rescaled_at[m] : last + 1]:
                    if red == r:
                        out.update((m, row, copy) for row, copy in items)
        return out

    def rescale(self, num_reducers: int, persisted: list[tuple[int, int]]) -> None:
        """The reducers are now ``num_reducers``, every mapper's rows after its persisted
        ``(input, shuffle)`` point routed by the new count (and cut afresh)."""
        self.num_reducers = num_reducers
        for m, (cut, shuffle) in enumerate(persisted):
            assert self.shuffle_at[m].get(cut) == shuffle, (
                f"mapper {m} persisted ({cut}, {shuffle}) at the rescale, not a batch boundary"
            )
            del self.outputs[m][shuffle:]
            self.rescaled_at[m] = shuffle
            self.cuts[m] = {b: e for b, e in self.cuts[m].items() if e <= cut}
            self.shuffle_at[m] = {i: s for i, s in self.shuffle_at[m].items() if i <= cut}
            self.end[m] = cut
            if not self.preaggregate:
                for row in range(cut, self.totals[m]):
                    self.outputs[m].extend(map_rows(m, [row], num_reducers, False))
                    self.shuffle_at[m][row + 1] = len(self.outputs[m])

    def effects_before(self, m: int, shuffle: int) -> list[tuple[int, int, int]]:
        """Every effect of mapper ``m``'s shuffle rows below ``shuffle``."""
        return [(m, row, copy) for _, items in self.outputs[m][:shuffle] for row, copy in items]

    def all_effects(self) -> set[tuple[int, int, int]]:
        return {
            (m, row, copy)
            for m, total in enumerate(self.totals)
            for row in range(total)
            for copy in range(fanout(m, row))
        }


def effects_of_rows(m: int, end: int) -> list[tuple[int, int, int]]:
    """Every effect of mapper ``m``'s input rows below ``end`` (any batch cuts)."""
    return [(m, row, copy) for row in range(end) for copy in range(fanout(m, row))]
