"""Ingest (thesis 4.3.3): read the partition, check the persisted state, ``map``, and push
each batch into the window; the shuffle numbering (taken over by a new instance at least
once) and the batch plans that make it reproducible after a restart; the window's schema,
which the mapped rows are unified into (:mod:`millstream.schema_unification`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa

from millstream import _core
from millstream.api import Partitioned
from millstream.backoff import Backoff
from millstream.exceptions import (
    ConfigurationError,
    InputError,
    MemoryLimitError,
    MillstreamError,
    SchemaEvolutionError,
    SplitBrainError,
    StoreConflictError,
    UserCodeError,
)
from millstream.inputs.base import ReadResult, WaitingReader
from millstream.ledger import (
    MapperState,
    plan_key,
    read_mapper_state,
    read_processor_info,
    read_reducer_state,
    read_rescale,
    read_window_schema,
    write_mapper_state,
    write_numbering,
    write_window_schema,
)
from millstream.ledger.spill import spilled_through
from millstream.rpc.calls import max_payload_bytes
from millstream.schema_unification import concat, conform, unify
from millstream.state import Store, StoreTransaction, pack, unpack
from millstream.workers.mapper_worker.map_dead_letters import MapDeadLetters


class Ingestion(MapDeadLetters):
    """The mapper's ingestion steps (a part of :class:`MapperWorker`)."""

    def start_ingestion(self) -> None:
        """Load the persisted state and start a fresh window from it (step 0 of 4.3.3).

        At least once, the instance first takes over the mapper's numbering
        (:meth:`_take_numbering`). Rows spilled for stragglers are never buffered again.
        """
        if self.processor.at_least_once:
            self.persisted = self.store.transact(self._take_numbering)
        with self.store.read() as txn:
            if not self.processor.at_least_once:
                self.persisted = read_mapper_state(txn, self.index)
            plan = read_rescale(txn)
            self.rescale_through = None if plan is None else plan.committed[self.index]
            info = read_processor_info(txn)
            self.window_schema = read_window_schema(txn, self.index)
            spilled = [
                spilled_through(txn, r, self.index) for r in range(self.processor.num_reducers)
            ]
        if info is not None and info.num_reducers != self.processor.num_reducers:
            # A worker of the shape before a rescale (which bumped every mapper's state,
            # so that a live one gets here): its buckets are not the reducers' any more.
            raise ConfigurationError(
                f"mapper {self.index}: the processor now has {info.num_reducers} reducers "
                f"(rescaled) but this worker was started with {self.processor.num_reducers}; "
                "stop it and start the processor with the new count"
            )
        old = self.window
        window = _core.Window(
            self.processor.num_reducers,
            self.memory_limit_bytes,
            self.persisted.input_unread_row_index,
            self.persisted.shuffle_unread_row_index,
            self.persisted.continuation_token,
            max_payload_bytes=max_payload_bytes(self.tuning.grpc_max_message_bytes),
        )
        for r, through in enumerate(spilled):
            if through >= 0:  # rows in the store already: never buffered again
                window.mark_spilled(r, through)
        # One swap: the window with new, empty claims and its input not ended
        # (:mod:`.window_service`); a GetRows sees the old state or the new.
        self.window = window
        if old is not None:
            old.close()
        self._token = self.persisted.continuation_token
        self.behind = True  # until the first read says otherwise
        self._batches_unpersisted = 0
        self._input_trimmed_to = None

    def _take_numbering(self, txn: StoreTransaction) -> MapperState:
        """At least once: make this instance's numbering the one reducers commit from.

        No batch boundaries are recorded, so this instance may cut the input after the
        persisted state differently from the one before, and its shuffle indices would
        name other rows. It therefore numbers its rows above every reducer's committed
        index and every spilled row (each reducer then receives every row after the
        persisted state: some of them again, none lost), and names itself in
        :func:`numbering_key`, which reducers check in the transaction that commits rows:
        rows an earlier instance served can no longer be committed. Reducer states are
        read with conflicts, so a reducer's commit and this takeover are ordered one way or
        the other.

        Returns:
            The persisted state the window starts from.
        """
        state = read_mapper_state(txn, self.index)
        m = self.processor.num_partitions
        committed = max(
            max(
                read_reducer_state(txn, r, m).committed_row_indices[self.index],
                spilled_through(txn, r, self.index),
            )
            for r in range(self.processor.num_reducers)
        )
        write_numbering(txn, self.index, self.guid)
        if committed < state.shuffle_unread_row_index:
            return state
        return write_mapper_state(
            txn,
            self.index,
            MapperState(
                state.input_unread_row_index,
                committed + 1,
                state.continuation_token,
                state.version,
            ),
        )

    def ingest_once(self) -> bool:
        """Read, check, map and push one batch. Returns whether rows were appended.

        Raises:
            SplitBrainError: Another instance wrote this mapper's state; restart ingestion.
            UserCodeError: ``map`` raised or returned something unusable.
        """
        window = self._require_window()
        begin = window.snapshot().input_end_row_index
        if self._past_rescale_cut(window):
            self.end_of_input = True  # a rescale's run: the input ends here
            self._notify_rows()
            return False
        try:
            asked = self.batch_size.rows()
            result = self.reader.read(begin, begin + asked, self._token)
        except InputError:
            self._check_persisted()  # another instance may have trimmed what this one reads
            raise
        batch = result.batch
        rows = 0 if batch is None else batch.num_rows
        if rows == 0 or self.processor.at_least_once:
            # Exactly once, rows are checked by the transaction that records their batch
            # (:meth:`plan_batch`), before any of them reaches the window.
            self._check_persisted()
        # Told to gathering reducers only once this batch's rows are in the window (below),
        # or a reducer that stops gathering would leave them for another commit.
        behind = rows >= asked and not result.end_of_input
        if batch is None or rows == 0:
            self.behind = behind
            self._notify_rows()  # a reducer gathering rows stops waiting for more
            self.end_of_input = result.end_of_input
            if result.continuation_token != self._token:
                window.push(_EMPTY, _EMPTY_INDICES, begin, result.continuation_token)
                self._token = result.continuation_token
            return False
        end = self.plan_batch(begin, begin + rows)
        if end != begin + rows:
            result = self._read_cut(begin, end)
            batch = result.batch
            assert batch is not None
            rows = batch.num_rows
        try:
            mapped = self.user.map(batch)
        except Exception as exc:
            if self.tuning.on_user_error != "dead_letter":
                raise UserCodeError(
                    f"map of mapper {self.index} raised on input rows [{begin}, {end}): "
                    f"{exc!r}. Nothing of these rows was sent; fix the mapper and restart "
                    "the processor"
                ) from exc
            # Every row a dead letter: the window moves past them all the same.
            mapped = self.map_around_dead_letters(batch, begin, exc) or Partitioned(
                _EMPTY, _EMPTY_INDICES
            )
        if not isinstance(mapped, Partitioned):
            raise UserCodeError(
                f"map of mapper {self.index} returned {type(mapped).__name__} for input rows "
                f"[{begin}, {end}); it must return millstream.Partitioned"
            )
        rows_out = self._into_window_schema(mapped.batch, begin, end)
        if rows_out is None:
            return False
        try:
            held = window.snapshot().buffered_bytes
            window.push(rows_out, mapped.reducer_indices, end, result.continuation_token)
            entry_bytes = max(0, window.snapshot().buffered_bytes - held)
            self._entry_bytes.append(entry_bytes)
            self.batch_size.saw(rows, batch.nbytes, entry_bytes)
            self.behind = behind
            self._notify_rows()
        except MemoryLimitError as exc:
            raise ConfigurationError(
                f"mapper {self.index}: the rows mapped from input rows [{begin}, {end}) alone "
                f"need more than the window's memory limit ({self.memory_limit_bytes} bytes): "
                f"{exc}. Lower tuning.batch_rows or raise tuning.memory_limit_bytes (a mapper "
                "reading several partitions gives each an equal share of it)"
            ) from exc
        except MillstreamError as exc:
            raise UserCodeError(
                f"map of mapper {self.index} produced unusable rows for input rows "
                f"[{begin}, {end}): {exc}"
            ) from exc
        self._token = result.continuation_token
        self.end_of_input = result.end_of_input or self._past_rescale_cut(window)
        self.caught_up = result.caught_up
        self.rows_read += rows
        self.rows_shuffled += mapped.batch.num_rows
        self.batches += 1
        self._batches_unpersisted += 1
        return True

    def _into_window_schema(
        self, batch: pa.RecordBatch, begin: int, end: int
    ) -> pa.RecordBatch | None:
        """The mapped rows of input rows ``[begin, end)`` cast into the window's schema.

        The window carries one schema, the unified schema of the mapped rows so far. Rows
        that it holds go in cast; rows that widen it (a column added, a type widened)
        cannot join the rows buffered already, so the widened schema is recorded in the
        store and ingestion restarts from the persisted state, as after a split brain: the
        new window casts every replayed batch into it (at least once, the instance ends
        instead and a new one starts from the record). Returns None after a restart.

        Raises:
            UserCodeError: The rows' schema does not unify with the window's.
            SplitBrainError: At least once: the window's schema widened.
        """
        known = self.window_schema
        if batch.num_rows == 0 or known is None or batch.schema.equals(known):
            if batch.num_rows and known is None:
                self.window_schema = batch.schema
            return batch
        try:
            unified = unify(known, batch.schema)
            if unified.equals(known):
                return conform(batch, known)
        except SchemaEvolutionError as exc:
            raise UserCodeError(
                f"map of mapper {self.index} returned rows for input rows [{begin}, {end}) "
                f"whose schema does not unify with its earlier rows': {exc}. Nothing of these "
                "rows was sent; return columns whose types widen into one (cast them in map)"
            ) from exc

        def record(txn: StoreTransaction) -> None:
            self._verify_persisted(txn)
            stored = read_window_schema(txn, self.index)
            write_window_schema(
                txn, self.index, unified if stored is None else unify(stored, unified)
            )

        self.store.transact(record, idempotent=True)  # unifying again changes nothing
        if self.processor.at_least_once:
            raise SplitBrainError(
                f"mapper {self.index}: its mapped rows widened their schema at input row "
                f"{begin}; a new instance carries the widened schema"
            )
        self.start_ingestion()
        return None

    def _past_rescale_cut(self, window: _core.Window) -> bool:
        """In a rescale's run: every row up to the last one an old reducer committed is
        mapped (a batch boundary: the input ends here for this run)."""
        through = self.rescale_through
        return through is not None and window.snapshot().shuffle_end_row_index > through

    def plan_batch(self, begin: int, end: int) -> int:
        """Fix the boundaries of the batch starting at input row ``begin``; returns its end.

        ``map`` may combine the rows of a batch (pre-aggregate), so the shuffle numbering is
        only reproducible if a batch re-read after a restart, or by a second live instance,
        has the same boundaries as the first time, whatever the input had available then.
        The first instance to map a batch records ``[begin, end)`` in the store before any
        of its rows can be sent; everyone after follows that record. Records below the
        persisted input index are cleared by :meth:`trim_input_rows`.

        The record is read and written with the persisted state checked in the same
        transaction: another instance that persisted past ``begin`` since this one's last
        check has cleared the records there, and recording a new cut would renumber rows
        that reducers may already have committed.

        At least once nothing is recorded: a new instance renumbers instead
        (:meth:`_take_numbering`).

        Returns:
            ``end``, or the end another instance recorded first.

        Raises:
            SplitBrainError: Another instance wrote this mapper's state.
        """
        if self.processor.at_least_once:
            return end
        return record_batch_plan(self.store, self.index, begin, end, self._verify_persisted)

    def _read_cut(self, begin: int, end: int) -> ReadResult:
        """Read input rows ``[begin, end)``: a batch whose end an earlier instance recorded.

        Another live instance may persist past the batch and trim the input while this one
        reads: the read then fails on trimmed rows, and the changed persisted state makes it
        split brain (restart ingestion), as for the first read of the batch.

        Raises:
            SplitBrainError: Another instance wrote this mapper's state.
            InputError: The input lost the rows and nobody else moved past them.
        """
        try:
            result = self._read_exactly(begin, end)
        except InputError:
            self._check_persisted()
            raise
        self._check_persisted()
        return result

    def _read_exactly(self, begin: int, end: int) -> ReadResult:
        """Input rows ``[begin, end)`` as one batch, reading from this instance's token."""
        pieces: list[pa.RecordBatch] = []
        token, at, end_of_input, idle = self._token, begin, False, 0
        while at < end:
            result = self.reader.read(at, end, token)
            rows = 0 if result.batch is None else result.batch.num_rows
            if rows == 0:
                idle += 1
                if result.end_of_input or idle > 100:
                    raise InputError(
                        f"mapper {self.index}: input rows [{begin}, {end}) were mapped before "
                        f"(by an earlier instance) but the partition now gives none after row "
                        f"{at}; the input lost rows it had. Restore them or start a new processor"
                    )
                token = result.continuation_token
                self.clock.sleep(self.tuning.idle_seconds)
                continue
            assert result.batch is not None
            if at + rows > end:
                raise InputError(
                    f"mapper {self.index}: the reader returned rows [{at}, {at + rows}) when asked "
                    f"for rows up to {end}; a PartitionReader must not read past its hint"
                )
            pieces.append(result.batch)
            at += rows
            token, end_of_input = result.continuation_token, result.end_of_input
        try:
            batch = concat(pieces)
        except SchemaEvolutionError as exc:
            raise InputError(
                f"mapper {self.index}: input rows [{begin}, {end}) were read in pieces of "
                f"schemas that do not unify ({exc}); a PartitionReader must return the same "
                "rows after a restart"
            ) from exc
        return ReadResult(batch, token, end_of_input)

    def _wait_for_input(self, stop: threading.Event, idle: Backoff) -> None:
        """Wait after a read found no rows, or returned the last rows there were
        (:attr:`caught_up`): when the reader can wait for rows
        (:class:`WaitingReader`), until the next append wakes it, at most ``idle.next()``
        (its timeout grows while the partition stays empty: it only catches a lost wake);
        else asleep for ``idle_seconds``, a poll period."""
        reader = self.reader
        if self.end_of_input or not isinstance(reader, WaitingReader):
            self.clock.sleep(self.tuning.idle_seconds, stop)
            return
        begin = self._require_window().snapshot().input_end_row_index
        self.clock.wait(lambda seconds: reader.wait_for_rows(begin, seconds), idle.next(), stop)


def record_batch_plan(
    store: Store,
    mapper_index: int,
    begin: int,
    end: int,
    verify: Callable[[StoreTransaction], None],
) -> int:
    """The transaction of :meth:`Ingestion.plan_batch`: read the end recorded for mapper
    ``mapper_index``'s batch at input row ``begin``, or record ``end`` and commit, with
    ``verify`` (the persisted-state check) run first in the same transaction.

    Returns:
        ``end``, or the end recorded first.

    Raises:
        SplitBrainError: ``verify`` found another instance's state.
        StoreConflictError: Ten attempts in a row conflicted.
    """
    key = plan_key(mapper_index, begin)
    for _ in range(10):
        txn = store.create_transaction()
        try:
            verify(txn)
            raw = txn.get(key)
            if raw is not None:
                return int(unpack(raw)[0])
            txn.set(key, pack((end,)))
            txn.commit()
            return end
        except StoreConflictError:
            continue
        finally:
            txn.reset()
    raise StoreConflictError(f"mapper {mapper_index}: could not record the batch at {begin}")


_EMPTY = pa.RecordBatch.from_arrays([], names=[])
_EMPTY_INDICES = pa.nulls(0, pa.int32())
