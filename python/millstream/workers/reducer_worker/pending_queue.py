"""A queue reducer's pending rows: fetched from the mappers, not committed yet.

Per mapper the rows after the reducer's committed index, in shuffle order, with their
shuffle indices (a queue reducer asks for them), and the fetch position: the next GetRows
asks for rows after it, so the mappers send every row once while it stays in their
windows until committed. Committing a prefix per mapper drops it here; after a failure a
new instance starts from the committed indices and fetches the rest again.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from millstream import _core
from millstream.exceptions import SchemaEvolutionError, UserCodeError
from millstream.queue_reducer import PendingRows
from millstream.schema_unification import concat_tables


class PendingQueue:
    """The pending rows of one reducer instance, per mapper.

    Args:
        num_mappers: The processor's mappers.
    """

    def __init__(self, num_mappers: int) -> None:
        self.num_mappers = num_mappers
        self.base: tuple[int, ...] | None = None
        """The committed indices the pending rows follow (None: not read yet)."""
        self.fetched: list[int] = [-1] * num_mappers
        """Per mapper, the shuffle index of the last row fetched (the fetch position)."""
        self._rows: list[list[pa.RecordBatch]] = [[] for _ in range(num_mappers)]
        self._indices: list[list[np.ndarray]] = [[] for _ in range(num_mappers)]
        self.arrived = 0
        """Rows added since the last :meth:`view`."""
        self._viewed: list[tuple[int, int]] = []
        """(mapper, rows) of the last :meth:`view`, in its order."""

    def follow(self, committed: tuple[int, ...]) -> bool:
        """Align with the committed indices read from the store: drop the rows at or below
        them (committed by this instance, or by another one of this reducer). Returns
        whether anything changed."""
        if committed == self.base:
            return False
        self.base = committed
        for m, through in enumerate(committed):
            self.fetched[m] = max(self.fetched[m], through)
            self._drop_through(m, through)
        return True

    def _drop_through(self, m: int, through: int) -> None:
        rows, indices = self._rows[m], self._indices[m]
        while indices and indices[0][-1] <= through:
            rows.pop(0)
            indices.pop(0)
        if indices and indices[0][0] <= through:
            keep = int(np.searchsorted(indices[0], through, side="right"))
            rows[0] = rows[0].slice(keep)
            indices[0] = indices[0][keep:]

    def add(self, m: int, rows: pa.RecordBatch) -> int:
        """Add rows of mapper ``m`` that carry their shuffle indices (the last column);
        returns how many were new (after the fetch position)."""
        indices = rows.column(_core.SHUFFLE_INDEX_COLUMN).to_numpy()
        rows = rows.drop_columns([_core.SHUFFLE_INDEX_COLUMN])
        fresh = indices > self.fetched[m]
        if not fresh.all():
            keep = int(np.searchsorted(indices, self.fetched[m], side="right"))
            rows, indices = rows.slice(keep), indices[keep:]
        if not len(indices):
            return 0
        self._rows[m].append(rows)
        self._indices[m].append(indices)
        self.fetched[m] = int(indices[-1])
        self.arrived += len(indices)
        return len(indices)

    def __len__(self) -> int:
        return sum(len(i) for chunks in self._indices for i in chunks)

    def view(self, ended: frozenset[int], share: float = 1.0) -> PendingRows:
        """The pending rows, mapper after mapper, for the user's ``process``: all of them,
        or the first ``share`` of each mapper's (at least one; a reducer whose round was
        too large for one transaction). A mapper whose rows are cut is not ended."""
        kept = []
        counts = []
        cut = set()
        for m in range(self.num_mappers):
            total = sum(len(i) for i in self._indices[m])
            keep = total if share >= 1.0 else min(total, max(1, int(total * share)))
            counts.append(keep)
            if keep < total:
                cut.add(m)
            if keep:
                kept.append((m, keep))
        ended = frozenset(ended - cut)
        mappers = np.concatenate([np.full(n, m, dtype=np.int32) for m, n in enumerate(counts)])
        try:
            tables = [
                concat_tables([pa.Table.from_batches([b]) for b in self._rows[m]]).slice(0, keep)
                for m, keep in kept
            ]
            rows = concat_tables(tables) if tables else pa.table({})
        except SchemaEvolutionError as exc:
            raise UserCodeError(
                f"the mappers' rows have incompatible schemas ({exc}). Every mapper's map "
                "must return columns of compatible types"
            ) from exc
        arrived, self.arrived = self.arrived, 0
        self._viewed = kept
        return PendingRows(rows, mappers, ended, arrived)

    def viewed_indices(self) -> np.ndarray:
        """The shuffle index of each row of the last :meth:`view` (int64)."""
        indices = [np.concatenate(self._indices[m])[:keep] for m, keep in self._viewed]
        return np.concatenate(indices) if indices else np.zeros(0, np.int64)

    def committed_after(self, prefix: dict[int, int]) -> tuple[int, ...]:
        """The committed indices once ``prefix`` (mapper: rows finished from its first
        pending row on) is committed."""
        assert self.base is not None
        out = list(self.base)
        for m, n in prefix.items():
            if n <= 0:
                continue
            at = n - 1
            for indices in self._indices[m]:
                if at < len(indices):
                    out[m] = int(indices[at])
                    break
                at -= len(indices)
        return tuple(out)
