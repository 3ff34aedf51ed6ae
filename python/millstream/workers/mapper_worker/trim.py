"""Trim (thesis 4.3.5): the two independent steps that free what is no longer needed.

- **trim window entries** (free memory): a GetRows pops its reducer's bucket up to the
  index the reducer committed, and the window drops every entry no bucket points into any
  more (the bucket pointer counts, in the Rust window: ``rust/millstream-core``'s window,
  reached from :meth:`~.window_service.WindowService.handle_get_rows`);
- **trim input rows** (persist and trim input): :meth:`InputTrim.trim_input_rows` persists
  the window's local state, when the persisted one is unchanged and every reducer's claim
  is committed, then trims the input below it.
"""

from __future__ import annotations

from millstream.exceptions import CommitUnknownResultError
from millstream.ledger import (
    MapperState,
    clear_batch_plans,
    mapped_key,
    read_mapper_state,
    write_mapper_state,
)
from millstream.workers.fencing import check_claims
from millstream.workers.mapper_worker.instance import MapperInstance


class InputTrim(MapperInstance):
    """TrimInputRows (a part of :class:`MapperWorker`)."""

    def trim_input_rows(self) -> bool:
        """TrimInputRows: persist the local state if nobody else wrote, then trim the input.

        Runs in one transaction that re-reads the persisted state; when it is still the one
        this instance last saw and the local state is further along, the local state is
        written. The input is trimmed only after that commit.

        Returns:
            Whether the persisted state advanced.

        Raises:
            SplitBrainError: Another instance wrote this mapper's state.
            WindowLostRowsError: A reducer claimed rows the store does not say it committed
                (the window dropped them); restart from the persisted state.
        """
        state = self.serving  # the window and the claims made against it, together
        window = self._require_window(state)
        input_index, shuffle_index, token = window.local_state()
        claims = state.claims.snapshot()  # after the state: covers every pop it reflects
        advanced = (
            input_index > self.persisted.input_unread_row_index
            or shuffle_index > self.persisted.shuffle_unread_row_index
        )
        txn = self.store.create_transaction()
        written: MapperState | None = None
        try:
            self._verify_persisted(txn)
            check_claims(txn, self.index, self.processor.num_partitions, claims)
            if not advanced:
                txn.reset()
                self._trim_to_persisted()
                return False
            local = MapperState(input_index, shuffle_index, token, self.persisted.version)
            written = write_mapper_state(txn, self.index, local)
            clear_batch_plans(txn, self.index, input_index)
            if self._batches_unpersisted:
                txn.add(mapped_key(self.index, "batches"), self._batches_unpersisted)
            txn.commit()
        except CommitUnknownResultError:
            txn.reset()
            if not self._applied(written):
                raise
        except BaseException:
            txn.reset()
            raise
        assert written is not None
        self.persisted = written
        self._batches_unpersisted = 0
        self._trim_to_persisted()
        return True

    def _trim_to_persisted(self) -> None:
        """Trim the input up to the persisted state, unless this instance did already.

        After a restart too: the state may have been persisted by a commit whose outcome
        its instance never learned (or just before it died), and then nobody trimmed there.
        """
        state = self.persisted
        if state.input_unread_row_index and self._input_trimmed_to != state.input_unread_row_index:
            self.reader.trim(state.input_unread_row_index, state.continuation_token)
            self._input_trimmed_to = state.input_unread_row_index

    def _applied(self, written: MapperState | None) -> bool:
        """After an unknown commit result: did our write land?"""
        with self.store.read() as txn:
            return written is not None and read_mapper_state(txn, self.index) == written
