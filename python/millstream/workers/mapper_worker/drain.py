"""A mapper's end of a run: its bounded input read, every row committed and that state
persisted, recorded in the store as drained."""

from __future__ import annotations

from millstream.ledger import drained_key
from millstream.state import StoreTransaction, pack
from millstream.workers.mapper_worker.instance import MapperInstance


class MapperDrain(MapperInstance):
    """The mapper's drain (a part of :class:`MapperWorker`)."""

    def is_drained(self) -> bool:
        """Bounded input fully read, every row committed, and that state persisted."""
        if self.window is None or not self.end_of_input:
            return False
        window = self.window.snapshot()
        return (
            window.num_entries == 0
            and window.input_unread_row_index == self.persisted.input_unread_row_index
            and window.shuffle_unread_row_index == self.persisted.shuffle_unread_row_index
        )

    def mark_drained(self) -> None:
        """Record in the store that this mapper's rows are all committed (checked state)."""

        def mark(txn: StoreTransaction) -> None:
            self._verify_persisted(txn)
            txn.set(drained_key(self.index), pack((self.persisted.input_unread_row_index,)))

        # Idempotent: it re-checks the state and writes the same marker.
        self.store.transact(mark, idempotent=True)
