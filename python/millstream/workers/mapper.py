"""The mapper worker (thesis 4.3): ingestion, GetRows, and the two trimming steps.

The protocol steps are plain methods (:meth:`MapperWorker.ingest_once`,
:meth:`~MapperWorker.handle_get_rows`, :meth:`~MapperWorker.trim_input_rows`) so that a
simulation can drive them one by one; :meth:`~MapperWorker.run` is the thin loop around them.
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from millstream import _core
from millstream.api import Partitioned
from millstream.backoff import Backoff
from millstream.exceptions import (
    CommitUnknownResultError,
    ConfigurationError,
    InputError,
    MapperSupersededError,
    MemoryLimitError,
    MillstreamError,
    RetryableStoreError,
    SplitBrainError,
    StoreConflictError,
    StoreUnavailableError,
    UserCodeError,
)
from millstream.inputs.base import PartitionReader, ReadResult, WaitingReader
from millstream.ledger import (
    MapperState,
    drained_key,
    mapped_key,
    plan_key,
    read_mapper_state,
    read_numbering,
    read_processor_info,
    read_reducer_state,
    read_rescale,
    write_mapper_state,
    write_numbering,
)
from millstream.ledger.spill import spilled_through, write_spill_chunk
from millstream.rpc.calls import max_payload_bytes
from millstream.state import Store, StoreTransaction, pack, unpack
from millstream.workers.claims import check_claims
from millstream.workers.clock import SYSTEM_CLOCK, Clock
from millstream.workers.serving import ServingState, WindowService

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.mapper")

SPILL_TO_SHARE = 0.5
"""A straggler spill empties the window down to this share of its memory limit."""

SPILL_CHUNK_SHARE = 0.9
"""A spilled chunk takes at most this share of the store's value limit."""


class MapperWorker(WindowService):
    """One mapper instance over one input partition (a mapper worker reading several
    partitions runs one of these per partition, :mod:`millstream.workers.serve`).

    Args:
        processor: The processor this mapper belongs to.
        index: The input partition it reads (the index its records are kept under).
        store: The processor's store.
        clock: Time source.
        reader: The partition reader (default: the processor input's reader of ``index``).
        guid: This instance's GUID (default: a new random one).
        memory_limit_bytes: Its window's limit (default: ``Tuning.memory_limit_bytes``; a
            worker reading several partitions shares that between them).
    """

    def __init__(
        self,
        processor: Processor,
        index: int,
        store: Store,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reader: PartitionReader | None = None,
        guid: str | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        super().__init__(index, guid or uuid.uuid4().hex, processor.num_reducers, clock)
        self.processor = processor
        self.store = store
        self.tuning = processor.tuning
        self.memory_limit_bytes = memory_limit_bytes or processor.tuning.memory_limit_bytes
        self.spec = processor.spec("mapper", index, self.guid)
        self.user = processor.mapper(self.spec, processor.config)
        self.reader = reader if reader is not None else processor.input.reader(index)
        self.persisted = MapperState()
        self._token = b""
        self.rows_read = 0
        self.rows_shuffled = 0
        self.batches = 0
        self._batches_unpersisted = 0
        self.started_at = clock.now()
        self.errors = 0
        self.last_error = ""
        self._input_trimmed_to: int | None = None
        self.rows_spilled = 0
        self.bytes_spilled = 0
        self.spills = 0
        self._entry_bytes: collections.deque[int] = collections.deque(maxlen=8)
        """Window bytes of the last few mapped batches: the room the next one needs."""
        self.rescale_through: int | None = None
        """During a rescale, the shuffle index this run's input ends past: at the first
        batch boundary after it (:mod:`millstream.ledger.rescale`)."""

    # -- ingestion (thesis 4.3.3) -------------------------------------------------------

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
        # (:mod:`millstream.workers.serving`); a GetRows sees the old state or the new.
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

    def _check_persisted(self) -> None:
        """Step 3 of 4.3.3: the persisted state must be the one this instance last saw."""
        with self.store.read() as txn:
            self._verify_persisted(txn)

    def _verify_persisted(self, txn: StoreTransaction) -> None:
        """Raise :class:`SplitBrainError` if ``txn`` sees another persisted state (at least
        once: :class:`MapperSupersededError` if another instance took the numbering)."""
        if self.processor.at_least_once:
            owner = read_numbering(txn, self.index)
            if owner != self.guid:
                raise MapperSupersededError(
                    f"mapper {self.index}: instance {owner} took over the numbering of this "
                    f"mapper's rows from instance {self.guid}, which stops"
                )
        current = read_mapper_state(txn, self.index)
        if current != self.persisted:
            raise SplitBrainError(
                f"mapper {self.index}: persisted state changed under this instance "
                f"({self.persisted} -> {current}); another instance is running"
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
            result = self.reader.read(begin, begin + self.tuning.batch_rows, self._token)
        except InputError:
            self._check_persisted()  # another instance may have trimmed what this one reads
            raise
        self._check_persisted()
        batch = result.batch
        rows = 0 if batch is None else batch.num_rows
        # Told to gathering reducers only once this batch's rows are in the window (below),
        # or a reducer that stops gathering would leave them for another commit.
        behind = rows >= self.tuning.batch_rows and not result.end_of_input
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
            raise UserCodeError(
                f"map of mapper {self.index} raised on input rows [{begin}, {end}): {exc!r}. "
                "Nothing of these rows was sent; fix the mapper and restart the processor"
            ) from exc
        if not isinstance(mapped, Partitioned):
            raise UserCodeError(
                f"map of mapper {self.index} returned {type(mapped).__name__} for input rows "
                f"[{begin}, {end}); it must return millstream.Partitioned"
            )
        try:
            held = window.snapshot().buffered_bytes
            window.push(mapped.batch, mapped.reducer_indices, end, result.continuation_token)
            self._entry_bytes.append(max(0, window.snapshot().buffered_bytes - held))
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
        self.rows_read += rows
        self.rows_shuffled += mapped.batch.num_rows
        self.batches += 1
        self._batches_unpersisted += 1
        return True

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
        key = plan_key(self.index, begin)
        for _ in range(10):
            txn = self.store.create_transaction()
            try:
                self._verify_persisted(txn)
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
        raise StoreConflictError(f"mapper {self.index}: could not record the batch at {begin}")

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
        if len(pieces) == 1:
            return ReadResult(pieces[0], token, end_of_input)
        batch = pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]
        return ReadResult(batch, token, end_of_input)

    def _require_window(self, state: ServingState | None = None) -> _core.Window:
        window = (self.serving if state is None else state).window
        if window is None:
            raise RuntimeError("start_ingestion() must run first")
        return window

    # -- straggler spill (thesis section 6) ----------------------------------------------

    def stragglers(self) -> list[int]:
        """Reducers that have not called GetRows for ``spill_after_seconds`` (down, hung or
        cut off; a reducer in a held call or a short commit calls again well within it)."""
        after = self.tuning.spill_after_seconds
        if after is None:
            return []
        now = self.clock.now()
        return [r for r, at in enumerate(self._last_call) if now - at >= after]

    def spill_stragglers(
        self, stragglers: Sequence[int] | None = None, target_bytes: int | None = None
    ) -> int:
        """Write to the store the rows the window holds only for ``stragglers`` (default:
        :meth:`stragglers`), from its oldest entries that another reducer has moved past,
        and let the window go of them, down to ``target_bytes`` (default: half of its
        memory limit): the mapper reads on and the other reducers keep committing while a
        reducer is down. Rows the other
        reducers committed are never written. A straggler reads its rows from the store
        before the window's (:mod:`millstream.ledger.spill`) and clears them in the
        transaction that commits them; the mapper's persisted state and its input's trim
        move past them.

        Returns:
            Rows spilled (0: nothing qualified, e.g. a reducer that is not a straggler still
            needs the oldest entry).

        Raises:
            SplitBrainError: Another instance wrote this mapper's state.
        """
        state = self.serving  # the window and the claims made against it, together
        window = self._require_window(state)
        stragglers = self.stragglers() if stragglers is None else list(stragglers)
        if not stragglers:
            return 0
        limits = self.store.limits
        if target_bytes is None:
            target_bytes = int(window.snapshot().memory_limit_bytes * SPILL_TO_SHARE)
        chunks = window.peek_spill(
            stragglers,
            target_bytes,
            min(self.tuning.commit_max_bytes, limits.max_transaction_bytes // 2),
            int(limits.max_value_bytes * SPILL_CHUNK_SHARE),
        )
        if not chunks:
            return 0
        claims = state.claims.snapshot()  # after the peek: covers every pop it reflects
        txn = self.store.create_transaction()
        try:
            self._verify_persisted(txn)
            # A reducer reads spilled rows straight from the store, right after what it
            # committed: a bucket popped past that (a false claim) must not spill.
            check_claims(txn, self.index, self.processor.num_partitions, claims)
            for reducer, _, last, _, payload in chunks:
                write_spill_chunk(txn, reducer, self.index, last, payload)
            txn.commit()
        except BaseException:
            txn.reset()
            raise
        through: dict[int, int] = {}
        for reducer, _, last, _, _ in chunks:
            through[reducer] = max(last, through.get(reducer, -1))
        for reducer, last in through.items():
            window.mark_spilled(reducer, last)
        rows = sum(c[3] for c in chunks)
        size = sum(len(c[4]) for c in chunks)
        self.spills += 1
        self.rows_spilled += rows
        self.bytes_spilled += size
        log.info(
            "mapper %d: window full, spilled %d rows (%d bytes) for reducer(s) %s, silent for "
            "%s s or more",
            self.index,
            rows,
            size,
            sorted(through),
            self.tuning.spill_after_seconds,
        )
        return rows

    # -- TrimInputRows (thesis 4.3.5) ---------------------------------------------------

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
            txn.clear_range(plan_key(self.index, 0), plan_key(self.index, input_index))
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

    # -- drain --------------------------------------------------------------------------

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

    def close(self) -> None:
        """Wake anything waiting on the window and release the reader."""
        self._closed = True
        if self.window is not None:
            self.window.close()
        self._notify_rows()
        self.reader.close()

    def metrics(self) -> dict[str, float | int | str]:
        """Status figures for ``millstream status``."""
        window = self.window.snapshot() if self.window is not None else None
        return {
            "guid": self.guid,
            "rows_read": self.rows_read,
            "rows_shuffled": self.rows_shuffled,
            "batches": self.batches,
            "input_end_row_index": window.input_end_row_index if window else 0,
            "input_unread_row_index": window.input_unread_row_index if window else 0,
            "persisted_input_unread_row_index": self.persisted.input_unread_row_index,
            "shuffle_unread_row_index": window.shuffle_unread_row_index if window else 0,
            "window_rows": window.buffered_rows if window else 0,
            "window_bytes": window.buffered_bytes if window else 0,
            "window_entries": window.num_entries if window else 0,
            "shuffle_end_row_index": window.shuffle_end_row_index if window else 0,
            "memory_limit_bytes": self.memory_limit_bytes,
            "spills": self.spills,
            "rows_spilled": self.rows_spilled,
            "bytes_spilled": self.bytes_spilled,
            "end_of_input": int(self.end_of_input),
            "uptime": self.clock.now() - self.started_at,
            "errors": self.errors,
            "last_error": self.last_error[:500],
        }

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Ingest until drained or stopped: the thin loop around the protocol steps.

        Store errors skip to the next iteration after a back-off (thesis 4.3.3 step 3);
        split brain restarts ingestion from the persisted state after a delay. A ``map``
        that raises stops the worker (``on_user_error="stop"``) or is retried.

        At least once, a split brain ends the worker instead: an instance superseded by a
        newer one returns (the newer one goes on), and any other split brain is raised, so
        that the runner starts a new instance (a new GUID: rows served from the old window
        can then never be committed under the new numbering).
        """
        t = self.tuning
        backoff = Backoff(t.backoff_seconds, t.backoff_max_seconds)
        while not stop.is_set():
            try:
                self.start_ingestion()
                self._ingest_loop(stop, backoff)
                return
            except MapperSupersededError as exc:
                self._note_error(exc)
                return
            except SplitBrainError as exc:
                self._note_error(exc)
                if self.processor.at_least_once:
                    raise
                self.clock.sleep(t.split_brain_delay_seconds, stop)
            except UserCodeError as exc:
                if t.on_user_error == "stop":
                    raise
                self._note_error(exc)
                self.clock.sleep(backoff.next(), stop)
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error(exc)
                self.clock.sleep(backoff.next(), stop)

    def _ingest_loop(self, stop: threading.Event, backoff: Backoff) -> None:
        t = self.tuning
        window = self._require_window()
        last_trim = self.clock.now()
        while not stop.is_set():
            progressed = False
            if not self.end_of_input:
                try:
                    progressed = self.ingest_once()
                    backoff.reset()
                except (RetryableStoreError, StoreUnavailableError) as exc:
                    self._note_error(exc)
                    self.clock.sleep(backoff.next(), stop)
                    continue
            while True:
                # Room for a batch like the recent ones (and a quarter more: sizes vary),
                # so that the next one keeps the window under its limit.
                reserve = max(self._entry_bytes, default=0) * 5 // 4
                room = window.wait_for_room(min(0.1, t.trim_period_seconds), reserve)
                if not room:
                    try:
                        self.spill_stragglers()
                    except (RetryableStoreError, StoreUnavailableError) as exc:
                        self._note_error(exc)
                now = self.clock.now()
                drained_window = self.end_of_input and window.snapshot().num_entries == 0
                if now - last_trim >= t.trim_period_seconds or drained_window:
                    last_trim = now
                    try:
                        self.trim_input_rows()
                    except (RetryableStoreError, StoreUnavailableError) as exc:
                        self._note_error(exc)
                if room or stop.is_set():
                    break
            if self.is_drained():
                self.mark_drained()
                return
            if not progressed:
                self._wait_for_input(stop)

    def _wait_for_input(self, stop: threading.Event) -> None:
        """Wait ``idle_seconds`` at most after a read found no rows: woken by the next
        append when the reader can wait for rows (:class:`WaitingReader`), else asleep."""
        reader = self.reader
        if self.end_of_input or not isinstance(reader, WaitingReader):
            self.clock.sleep(self.tuning.idle_seconds, stop)
            return
        begin = self._require_window().snapshot().input_end_row_index
        self.clock.wait(
            lambda seconds: reader.wait_for_rows(begin, seconds), self.tuning.idle_seconds, stop
        )

    def _note_error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("mapper %d: %s", self.index, self.last_error)


_EMPTY = pa.RecordBatch.from_arrays([], names=[])
_EMPTY_INDICES = pa.nulls(0, pa.int32())
