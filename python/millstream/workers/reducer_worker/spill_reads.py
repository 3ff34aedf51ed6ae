"""Spill reads: rows mappers spilled to the store for this reducer while it was a straggler
(:mod:`millstream.ledger.spill`), read before the mappers' windows, and cleared once
committed."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream import _core
from millstream.exceptions import (
    RetryableStoreError,
    SchemaEvolutionError,
    StoreUnavailableError,
    UserCodeError,
)
from millstream.ledger.spill import clear_spill, read_spill, spill_pending
from millstream.schema_unification import concat_tables
from millstream.state import StoreTransaction
from millstream.workers.reducer_worker.instance import ReducerInstance


def clear_committed_spill(
    txn: StoreTransaction, reducer_index: int, committed: Mapping[int, int]
) -> None:
    """Clear in ``txn`` the chunks spilled for the reducer whose rows it committed
    (``committed``: mapper index: shuffle index), in the commit that holds them or later."""
    for m, through in committed.items():
        clear_spill(txn, reducer_index, m, through)


class SpillReads(ReducerInstance):
    """The reducer's reads of spilled rows (a part of :class:`ReducerWorker`)."""

    def _read_spilled(
        self, committed: tuple[int, ...], max_bytes: int, *, indices: bool = False
    ) -> tuple[bool, dict[int, tuple[pa.RecordBatch, int, int]]]:
        """Rows mappers spilled for this reducer (a straggler) after its committed indices
        (a queue reducer: its fetch positions): whether any chunk waits for it at all, and
        per mapper the rows (their shuffle index column dropped unless ``indices``), the
        last shuffle index read and the bytes read; about ``max_bytes`` per mapper."""
        out: dict[int, tuple[pa.RecordBatch, int, int]] = {}
        with self.time_spent.spent_on("store"), self.store.read() as txn:
            if not spill_pending(txn, self.index):
                return False, out
            for m, after in enumerate(committed):
                chunks, _ = read_spill(txn, self.index, m, after, max_bytes)
                if not chunks:
                    continue
                rows = _core.decode_ipc([payload for _, payload in chunks])
                # Two live instances of a mapper may spill the same rows in other chunks:
                # rows in shuffle order, each once.
                rows = rows.take(pc.sort_indices(rows.column(_core.SHUFFLE_INDEX_COLUMN)))
                index = rows.column(_core.SHUFFLE_INDEX_COLUMN).to_numpy()
                fresh = np.ones(len(index), dtype=bool)
                fresh[1:] = index[1:] != index[:-1]
                rows = rows.filter(pa.array(fresh & (index > after)))
                if not indices:
                    rows = rows.drop_columns([_core.SHUFFLE_INDEX_COLUMN])
                out[m] = (rows, chunks[-1][0], sum(len(p) for _, p in chunks))
        return True, out

    def _clear_stale_spill(self, committed: tuple[int, ...]) -> None:
        """Clear chunks whose rows this reducer committed already (a mapper that learnt
        of a commit late may spill rows the reducer had committed from its window)."""
        txn = self.store.create_transaction()
        try:
            clear_committed_spill(txn, self.index, dict(enumerate(committed)))
            txn.commit()
        except (RetryableStoreError, StoreUnavailableError) as exc:
            self._note_error("clearing committed spilled rows", exc)
        finally:
            txn.reset()

    def _with_spilled(self, batch: pa.RecordBatch, parts: list[pa.RecordBatch]) -> pa.RecordBatch:
        """``batch`` (the mappers' window rows) and spilled rows, as one batch."""
        tables = [pa.Table.from_batches([b]) for b in [*parts, batch] if b.num_columns]
        if not tables:
            return batch
        try:
            table = concat_tables(tables)
        except SchemaEvolutionError as exc:
            raise UserCodeError(
                f"reducer {self.index}: spilled rows and the mappers' rows have incompatible "
                f"schemas ({exc}). Every mapper's map must return columns of compatible types"
            ) from exc
        return table.combine_chunks().to_batches()[0] if table.num_rows else batch
