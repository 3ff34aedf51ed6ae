"""The simulation's live worker instances: a mapper instance (its window seen through
:class:`WindowProbe`, the address it serves on) and a reducer instance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from millstream.workers import MapperWorker, ReducerWorker


class WindowProbe:
    """A mapper's window, with a ledger of every entry's bytes and rows as pushed.

    The worker sees the real window through it. The ledger lets the checker compare the
    window's memory accounting, after any trimming, with the entries it still holds; the
    bounds, each entry's charge with what its rows take (an entry is charged what it
    holds, not the buffers its batch was sliced from).
    """

    def __init__(self, window: Any) -> None:
        self.window = window
        # entry index -> (bytes, rows, input rows begin, end) when pushed
        self.ledger: dict[int, tuple[int, int, int, int]] = {}
        # entry index -> most bytes the entry may be charged
        self.bounds: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.window, name)

    def push(self, batch: Any, indices: Any, end: int, token: bytes) -> Any:
        w = self.window
        before = w.snapshot()
        first, n = before.first_entry_index, before.num_entries
        result = w.push(batch, indices, end, token)
        after = w.snapshot()
        gone = range(first, after.first_entry_index)
        new = first + n
        if after.first_entry_index <= new:
            freed = [self.ledger[i] for i in gone]
            self.ledger[new] = (
                after.buffered_bytes - before.buffered_bytes + sum(e[0] for e in freed),
                after.buffered_rows - before.buffered_rows + sum(e[1] for e in freed),
                before.input_end_row_index,
                end,
            )
            # Twice its rows' own bytes (copied when its buffers hold more) plus 64 KiB,
            # and the index: 4 bytes per row and reducer boundary, the token, a header.
            rows_bytes = batch.nbytes if batch.num_rows else 0
            index = 4 * (batch.num_rows + after.num_reducers + 1) + len(token) + 1024
            self.bounds[new] = 2 * rows_bytes + 64 * 1024 + index
        for i in gone:
            self.ledger.pop(i, None)
            self.bounds.pop(i, None)
        return result


@dataclass
class MapperInstance:
    """A live mapper object, the address it serves on, and where its window started.

    ``restarting``: its loop must (re)start ingestion before the next step (after split
    brain, or when that restart failed on a store error). ``registration``: its number in
    discovery and its beat counter, kept across beats (and when an observer removed its
    entry).
    """

    worker: MapperWorker
    address: str
    started_shuffle: int = 0
    restarting: bool = False
    registration: int | None = None
    beats: int | None = None
    forged: bool = False
    """A forged GetRows reached this window: it may have dropped uncommitted rows (the
    store-side invariants still check that none is lost)."""


@dataclass
class ReducerInstance:
    """A live reducer object."""

    worker: ReducerWorker
