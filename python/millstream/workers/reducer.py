"""The reducer worker (thesis 4.4.2): fetch from every mapper, reduce, commit atomically.

:meth:`ReducerWorker.run_once` is one iteration of the main procedure, a plain method a
simulation can drive; :meth:`~ReducerWorker.run` is the thin loop around it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream import _core
from millstream.api import Transaction
from millstream.backoff import Backoff
from millstream.exceptions import (
    CommitUnknownResultError,
    MillstreamError,
    RetryableStoreError,
    StoreConflictError,
    StoreUnavailableError,
    TransactionTooLargeError,
    TransactionTooOldError,
    UserCodeError,
)
from millstream.ledger import (
    REDUCER_ACTIVITIES,
    ReducerState,
    WorkerInfo,
    drained_key,
    list_workers,
    read_numbering,
    read_reducer_state,
    read_rescale,
    reduced_key,
    remove_stale_workers,
    write_reducer_state,
)
from millstream.ledger.spill import clear_spill, read_spill, spill_pending
from millstream.outputs import StagedOutputs, finish_publishing
from millstream.queue_reducer import PendingRows, QueueReducer
from millstream.rpc.calls import GetRowsCall, GetRowsResult, NotAnsweredYet, RowsClient
from millstream.state import Store, StoreTransaction
from millstream.state.replay import ReplayingTransaction
from millstream.workers import drain
from millstream.workers.cadence import CommitCadence
from millstream.workers.clock import SYSTEM_CLOCK, Clock
from millstream.workers.discovery import DiscoveryView
from millstream.workers.pending import PendingQueue
from millstream.workers.settling import ROUND, UnsettledOutputs
from millstream.workers.status import TimeSpent

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.reducer")


@dataclasses.dataclass(frozen=True)
class Round:
    """What one reducer transaction commits besides the user's writes.

    Attributes:
        state: The committed indices to write.
        rows: Rows the transaction covers (reduced, or finished by a queue reducer).
        consumed: Spilled rows the transaction holds (mapper: shuffle index): their chunks
            are cleared in it.
    """

    state: ReducerState
    rows: int
    consumed: Mapping[int, int]


class ReducerWorker:
    """One reducer instance.

    Args:
        processor: The processor this reducer belongs to.
        index: The reducer's index.
        store: The processor's store.
        rows_client: How GetRows reaches the mappers.
        clock: Time source.
        guid: This instance's GUID (default: a new random one).
    """

    def __init__(
        self,
        processor: Processor,
        index: int,
        store: Store,
        rows_client: RowsClient,
        *,
        clock: Clock = SYSTEM_CLOCK,
        guid: str | None = None,
    ) -> None:
        self.processor = processor
        self.index = index
        self.store = store
        self.rows_client = rows_client
        self.clock = clock
        self.tuning = processor.tuning
        self.guid = guid or uuid.uuid4().hex
        self.spec = processor.spec("reducer", index, self.guid)
        self.user = processor.reducer(self.spec, processor.config)
        self.commits = 0
        self.rows_reduced = 0
        self.bytes_fetched = 0
        self.split_brains = 0
        self.superseded_fetches = 0
        self.rows_emitted = 0
        """Rows appended to output queues by committed transactions."""
        self.files_published = 0
        """Files published to output sinks by committed transactions."""
        """At least once: fetches not committed because their mapper instance was
        superseded."""
        self.last_state: ReducerState | None = None
        self.all_drained = False
        self.rescaling = False
        """A rescale's run: the mappers' inputs end at its cut, which is not their end."""
        self.errors = 0
        self.last_error = ""
        self.started_at = clock.now()
        self._fetch_scale = 1.0
        self.last_write_size = 0
        self.last_transaction_seconds = 0.0
        """How long the last committed transaction took, ``reduce`` included."""
        self.capped = False
        self.behind = True
        """Whether a mapper said in its last answer that it is behind its input (at start:
        assume so; the first answers tell)."""
        self._row_bytes = 0.0
        """Arrow bytes per fetched row, recently (0: not known yet)."""
        self._spill_pending = False
        """Whether the last view found rows spilled for this reducer in the store."""
        self._missing_since: float | None = None
        """When a gathering reducer first found an undrained mapper missing from discovery."""
        self.renewals = 0
        self.time_spent = TimeSpent(*REDUCER_ACTIVITIES)
        """Where this reducer's time goes (``millstream status``)."""
        self.cadence = CommitCadence(self.tuning)
        """When the next round may start after one that committed (:meth:`run`)."""
        self._round_started = clock.now()
        self.discovery = DiscoveryView(clock, self.tuning.heartbeat_seconds)
        self.on_committed: Callable[[float, int, int, int], None] | None = None
        """Told each commit's latency (seconds), bytes written, rows reduced and Arrow
        bytes fetched: the metrics hook."""
        self.pending = (
            PendingQueue(processor.num_partitions) if isinstance(self.user, QueueReducer) else None
        )
        """A queue reducer's rows fetched and not committed (None for a plain reducer)."""
        self._ended: set[int] = set()
        """Queue reducer: mappers that said the reducer has fetched the last of their rows."""
        self._told_ended: frozenset[int] | None = None
        """Queue reducer: the ended mappers its last ``process`` was told of."""
        self._warned_memory = False
        self._pending_share = 1.0
        """Queue reducer: the share of each mapper's pending rows ``process`` sees (below 1
        after a round too large for one transaction)."""
        self._view_cut = False
        """Queue reducer: whether the last ``process`` saw only part of the pending rows
        (then the next round shows it the rest, whatever arrived)."""
        self.unsettled = UnsettledOutputs()
        """Staged files of commits whose outcome is unknown, published on the next rounds
        once the store tells that they landed."""

    def _read_view(self) -> tuple[ReducerState, dict[int, WorkerInfo], set[int]]:
        """Steps 2-3: the persisted state, live mappers, and mappers already drained.

        Mapper entries that stopped beating (on this reducer's clock) are skipped and
        removed from discovery.
        """
        m = self.processor.num_partitions
        with self.time_spent.spent_on("store"), self.store.read() as txn:
            state = read_reducer_state(txn, self.index, m)
            mappers, dead = self.discovery.observe(list_workers(txn, "mapper"))
            drained = {i for i in range(m) if txn.get(drained_key(i), snapshot=True) is not None}
            self._spill_pending = spill_pending(txn, self.index)
        if dead:
            self._forget_mappers(dead)
        return state, mappers, drained

    def _get_rows(self, calls: list[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """This round's answers (thesis 4.4.2 step 3), timed as waiting for the mappers."""
        if not calls:
            return []
        with self.time_spent.spent_on("mapper_wait"):
            return self.rows_client.get_rows_many(calls)

    def _forget_mappers(self, dead: list[WorkerInfo]) -> None:
        """Remove dead mapper entries from discovery; failing is harmless (retried later)."""
        txn = self.store.create_transaction()
        try:
            removed = remove_stale_workers(txn, dead)
            txn.commit()
        except (RetryableStoreError, StoreUnavailableError) as exc:
            self._note_error("removing dead mappers from discovery", exc)
            return
        finally:
            txn.reset()
        if removed:
            log.info(
                "reducer %d: removed %d mapper(s) that stopped beating from discovery: %s",
                self.index,
                removed,
                ", ".join(f"{w.index}@{w.guid}" for w in dead),
            )

    def drained_now(self) -> bool:
        """Whether every mapper has drained (a cheap check between commits)."""
        try:
            with self.store.read() as txn:
                return all(
                    txn.get(drained_key(i), snapshot=True) is not None
                    for i in range(self.processor.num_partitions)
                )
        except (RetryableStoreError, StoreUnavailableError):
            return False

    def _caps(self, live: int) -> tuple[int, int]:
        """Rows and bytes to ask each of ``live`` mappers for in this transaction."""
        t = self.tuning
        scale = self._fetch_scale
        rows = max(1, int(t.commit_max_rows * scale) // max(1, live))
        size = max(1, min(t.get_rows_max_bytes, int(t.commit_max_bytes * scale) // max(1, live)))
        return rows, size

    @property
    def gathering(self) -> bool:
        """Whether the next fetch lets the mappers gather a full commit's worth of rows
        (:attr:`~millstream.Tuning.gather_seconds`) instead of following the cadence."""
        return self.behind and self.tuning.gather_seconds > 0 and self.pending is None

    def _gather_rows(self, max_rows: int, max_bytes: int) -> int:
        """Rows each mapper should gather for this reducer before answering (0: none)."""
        if not self.gathering:
            return 0
        if self._row_bytes <= 0:
            return max_rows
        return max(1, min(max_rows, int(max_bytes / self._row_bytes)))

    def _await_missing_mappers(self, present: int) -> bool:
        """Whether to skip this round: a gathering reducer waits for every mapper to appear
        in discovery (at start-up they register one by one), at most ``gather_seconds``,
        so that its first commit holds every mapper's backlog instead of one mapper's rows
        alone. A mapper still missing after that (down) holds nobody."""
        if not self.gathering or present >= self.processor.num_partitions:
            self._missing_since = None
            return False
        now = self.clock.now()
        if self._missing_since is None:
            self._missing_since = now
        return now - self._missing_since < self.tuning.gather_seconds

    def run_once(self) -> bool:
        """One iteration of thesis 4.4.2 (steps 2-8). Returns whether a batch was committed.

        Mappers that fail to answer are skipped this round (their committed index stays).

        Raises:
            UserCodeError: ``reduce`` raised; nothing of the batch was committed.
            TransactionTooLargeError: Even a single row's writes exceed the store's limit.
            RetryableStoreError, StoreUnavailableError: The store failed; retry later.
        """
        self._round_started = self.clock.now()
        state, mappers, drained = self._read_view()
        self.settle_unknown_commits()
        self.last_state = state
        self.user.drained_mappers = frozenset() if self.rescaling else frozenset(drained)
        self.all_drained = len(drained) == self.processor.num_partitions and not self._spill_pending
        live = {
            m: info
            for m, info in mappers.items()
            if m not in drained and 0 <= m < self.processor.num_partitions
        }
        if self._await_missing_mappers(len(live) + len(drained)):
            return False
        if self.pending is not None:
            return self._run_queue_once(self.pending, state, live, drained)
        calls = self._round_calls(state, live)
        if not calls and not self._spill_pending:
            return False
        _, max_bytes = self._caps(len(live))
        results = self._get_rows(calls)
        answered = [result for result in results if isinstance(result, GetRowsResult)]
        if answered:
            self.behind = any(result.behind for result in answered)
            rows = sum(result.row_count for result in answered)
            if rows:
                self._row_bytes = sum(len(result.arrow_ipc) for result in answered) / rows
        self.capped = any(
            isinstance(result, GetRowsResult)
            and (result.row_count >= call.max_rows or len(result.arrow_ipc) >= call.max_bytes // 2)
            for call, result in zip(calls, results, strict=True)
        )
        new = list(state.committed_row_indices)
        payloads: list[bytes] = []
        ranges: list[str] = []
        senders: list[int] = []
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, NotAnsweredYet):
                continue  # still under way: its answer is used in a later round
            if not isinstance(result, GetRowsResult):
                self._note_error(f"GetRows from mapper {call.mapper_index}", result)
                continue
            if result.row_count == 0 or result.last_shuffle_row_index <= call.committed_row_index:
                continue
            new[call.mapper_index] = result.last_shuffle_row_index
            payloads.append(result.arrow_ipc)
            senders.append(call.mapper_index)
            ranges.append(
                f"mapper {call.mapper_index} shuffle rows "
                f"({call.committed_row_index}, {result.last_shuffle_row_index}]"
            )
        # Looked for only now that the mappers answered: a spill written after an answer
        # covers its rows, so the answer of a mapper with spilled rows waits for a later
        # round; a spill written before it shows here, even if the view above missed it.
        pending, spilled = self._read_spilled(state.committed_row_indices, max_bytes)
        if pending and not spilled:
            self._clear_stale_spill(state.committed_row_indices)
        for m, (_, last, size) in spilled.items():
            if m in senders:
                at = senders.index(m)
                del senders[at], payloads[at], ranges[at]
            new[m] = last
            ranges.append(
                f"mapper {m} spilled shuffle rows ({state.committed_row_indices[m]}, {last}]"
            )
            self.capped = self.capped or size >= max_bytes
        if not payloads and not spilled:
            return False
        batch = self._decode(payloads, senders)
        if spilled:
            batch = self._with_spilled(batch, [part for part, _, _ in spilled.values()])
        consumed = {m: last for m, (_, last, _) in spilled.items()}
        served_by = {call.mapper_index: call.mapper_guid for call in calls}
        if self.tuning.pipeline_fetch and calls:
            # The next rows come while this transaction runs; they serve the next round if
            # it commits (they continue from its indices), and are dropped otherwise.
            self.rows_client.prefetch(
                [
                    dataclasses.replace(call, after_row_index=new[call.mapper_index])
                    for call in calls
                ]
            )

        def reduce(txn: StoreTransaction, outputs: StagedOutputs) -> Round:
            self._user_code(
                lambda: self.user.reduce(batch, Transaction(txn, outputs)),
                f"reduce of reducer {self.index} raised on {batch.num_rows} rows "
                f"({'; '.join(ranges)})",
            )
            return Round(ReducerState(tuple(new)), batch.num_rows, consumed)

        try:
            committed = self._reduce_and_commit(
                state, reduce, sum(map(len, payloads)), {m: served_by[m] for m in senders}
            )
        except (TransactionTooLargeError, TransactionTooOldError) as exc:
            if batch.num_rows <= 1 and isinstance(exc, TransactionTooLargeError):
                raise TransactionTooLargeError(
                    f"reducer {self.index}: the writes of reduce for one row "
                    f"({'; '.join(ranges)}) exceed the store's transaction limits: {exc}. "
                    "Write less per row (FoundationDB: 10 MB and 5 s per transaction)"
                ) from exc
            self._rescale(getattr(exc, "size", None), getattr(exc, "limit", None), failed=True)
            if isinstance(exc, TransactionTooOldError):
                self._note_error(
                    "commit",
                    TransactionTooOldError(
                        f"reducer {self.index}: the store operations of one commit "
                        f"({batch.num_rows} rows: {'; '.join(ranges)}) took longer than the "
                        "transaction limit even replayed into a new transaction after reduce "
                        f"(reduce itself may take as long as it needs); fetching fewer rows "
                        f"next time (scale {self._fetch_scale:.3g}): {exc}"
                    ),
                )
                return False
            self._note_error("commit", exc)
            return False
        if committed:
            # The user hears of the commit first: telling the mappers of it takes calls.
            self._notify_commit()
            self._rescale(self.last_write_size, self.store.limits.max_transaction_bytes)
            if self.tuning.acknowledge_commits and not self._send_next_round(
                ReducerState(tuple(new)), live
            ):
                self.acknowledge(calls, new, senders)
        return committed

    def _send_next_round(self, state: ReducerState, live: dict[int, WorkerInfo]) -> bool:
        """After a commit, send the next round's GetRows at once when that round waits for
        the commit cadence: each tells its mapper of the commit on arrival (what a 0-row
        call would) and is answered when the round starts, with the rows that came
        meanwhile; a channel with a call under way needs no new thread per call either.
        Returns False (nothing sent) for a round that starts at once (the reducer is
        behind), and with ``pipeline_fetch`` (its calls under way name its fetch
        positions)."""
        if self.tuning.pipeline_fetch or self.capped or self.gathering:
            return False
        start_in = max(0.0, self.cadence.interval - (self.clock.now() - self._round_started))
        calls = [
            dataclasses.replace(call, start_in_seconds=start_in)
            for call in self._round_calls(state, live)
        ]
        with self.time_spent.spent_on("mapper_wait"):
            self.rows_client.prefetch(calls)
        return True

    def _round_calls(self, state: ReducerState, live: dict[int, WorkerInfo]) -> list[GetRowsCall]:
        """A round's GetRows from ``state``: held by a mapper without rows up to the poll,
        or while it gathers a backlog."""
        max_rows, max_bytes = self._caps(len(live))
        gather = self._gather_rows(max_rows, max_bytes)
        poll = min(
            self.tuning.gather_seconds if gather else self.tuning.get_rows_poll_seconds,
            self.tuning.rpc_timeout_seconds / 2,
        )
        return self._calls(state, live, max_rows, max_bytes, poll, gather_rows=gather)

    def _run_queue_once(
        self,
        queue: PendingQueue,
        state: ReducerState,
        live: dict[int, WorkerInfo],
        drained: set[int],
    ) -> bool:
        """One round of a queue reducer: fetch the rows after the fetch positions, give
        every pending row to ``process``, commit the finished prefix per mapper with what
        it wrote. Returns whether a transaction was committed.

        ``process`` runs when rows arrived, the ended mappers changed, or the last round's
        commit failed; a round that finishes and writes nothing commits nothing.
        """
        changed = queue.follow(state.committed_row_indices)
        max_rows, max_bytes = self._caps(len(live))
        poll = min(self.tuning.get_rows_poll_seconds, self.tuning.rpc_timeout_seconds / 2)
        calls = [
            dataclasses.replace(call, after_row_index=queue.fetched[call.mapper_index])
            for call in self._calls(state, live, max_rows, max_bytes, poll, shuffle_indices=True)
        ]
        results = self._get_rows(calls)
        answers: dict[int, GetRowsResult] = {}
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, NotAnsweredYet):
                continue
            if not isinstance(result, GetRowsResult):
                self._note_error(f"GetRows from mapper {call.mapper_index}", result)
                continue
            if call.after_row_index == queue.fetched[call.mapper_index]:
                answers[call.mapper_index] = result
        self.capped = any(
            result.row_count >= max_rows or len(result.arrow_ipc) >= max_bytes // 2
            for result in answers.values()
        )
        # Spilled rows come before the window's (see run_once): a mapper with some has its
        # answer used in a later round.
        spill_waits, spilled = self._read_spilled(tuple(queue.fetched), max_bytes, indices=True)
        if spill_waits and not spilled:
            self._clear_stale_spill(state.committed_row_indices)
        arrived = 0
        for m, (rows, _, size) in spilled.items():
            answers.pop(m, None)
            arrived += queue.add(m, rows)
            self.capped = self.capped or size >= max_bytes
        fetched_bytes = sum(size for _, _, size in spilled.values())
        for m, result in sorted(answers.items()):
            if result.row_count:
                arrived += queue.add(m, _core.decode_ipc([result.arrow_ipc]))
            if result.input_ended:
                self._ended.add(m)
            fetched_bytes += len(result.arrow_ipc)
        # A mapper is in _ended once an answer used whole (not set aside for spilled rows)
        # said its input ended: rows after it exist nowhere, in the window or spilled.
        ended = frozenset(drained) | frozenset(self._ended)
        if not len(queue) or not (
            arrived or changed or ended != self._told_ended or self._view_cut
        ):
            return False
        pending = queue.view(ended, self._pending_share)
        self._view_cut = len(pending) < len(queue)
        self._told_ended = None  # until this round's commit settles
        self._warn_if_pending_fills_memory(pending)

        user = self.user
        assert isinstance(user, QueueReducer)
        # A rescale's run ends at its cut, not at the processor's end: once every input
        # ended there the rows are handed over; until then no input has ended for process.
        handing_over = (
            self.rescaling and len(pending.ended_mappers) == self.processor.num_partitions
        )
        if self.rescaling and not handing_over:
            pending.ended_mappers = frozenset()
        step = user.hand_over if handing_over else user.process

        def process(txn: StoreTransaction, outputs: StagedOutputs) -> Round | None:
            self._user_code(
                lambda: step(pending, Transaction(txn, outputs)),
                f"{step.__name__} of reducer {self.index} raised on {len(pending)} pending rows",
            )
            prefix = pending.finished_prefix()
            new = queue.committed_after(prefix)
            if new == state.committed_row_indices and txn.write_size == 0 and outputs.empty:
                self._told_ended = ended  # nothing to commit: the round is settled
                self._pending_share = min(1.0, self._pending_share * 2)  # it wrote nothing
                return None
            consumed = dict(enumerate(new)) if spill_waits or spilled else {}
            return Round(ReducerState(new), sum(prefix.values()), consumed)

        try:
            committed = self._reduce_and_commit(state, process, fetched_bytes, {})
        except (TransactionTooLargeError, TransactionTooOldError) as exc:
            if len(pending) <= 1 and isinstance(exc, TransactionTooLargeError):
                raise TransactionTooLargeError(
                    f"reducer {self.index}: the writes of process for one pending row exceed "
                    f"the store's transaction limits: {exc}. Write less per round "
                    "(FoundationDB: 10 MB and 5 s per transaction)"
                ) from exc
            # The next rounds see a smaller prefix of each mapper's pending rows.
            self._pending_share /= 2
            self._note_error(
                "commit",
                type(exc)(
                    f"reducer {self.index}: the round over {len(pending)} pending rows was too "
                    f"large for one transaction; process sees the first "
                    f"{self._pending_share:.3g} of each mapper's pending rows next: {exc}"
                ),
            )
            return False
        if committed:
            self._pending_share = min(1.0, self._pending_share * 2)
        if committed and self.last_state is not None:
            queue.follow(self.last_state.committed_row_indices)
            self._told_ended = ended
            self._notify_commit()
            if self.tuning.acknowledge_commits:
                self.acknowledge(calls, list(self.last_state.committed_row_indices), list(live))
        return committed

    def _warn_if_pending_fills_memory(self, pending: PendingRows) -> None:
        """Log once when the pending rows take half the mappers' memory: they stay in the
        mappers' windows, and a mapper whose window is full reads no more input, so a
        reducer waiting for later rows to finish these (a watermark) would wait for ever."""
        held = pending.rows.nbytes
        limit = self.tuning.memory_limit_bytes
        if self._warned_memory or 2 * held < limit:
            return
        self._warned_memory = True
        log.warning(
            "reducer %d: its %d pending rows take %d bytes, half of or more than the mappers' "
            "tuning.memory_limit_bytes (%d): a mapper whose window fills reads no more input "
            "until rows are finished. Finish rows sooner, raise memory_limit_bytes, or keep "
            "state in the store instead (ms.windows.WindowReducer for windows)",
            self.index,
            len(pending),
            held,
            limit,
        )

    def _calls(
        self,
        state: ReducerState,
        live: dict[int, WorkerInfo],
        max_rows: int,
        max_bytes: int,
        poll: float,
        *,
        gather_rows: int = 0,
        shuffle_indices: bool = False,
    ) -> list[GetRowsCall]:
        """This round's GetRows, one per live mapper, from the committed indices."""
        return [
            GetRowsCall(
                m,
                info.address,
                info.guid,
                self.index,
                state.committed_row_indices[m],
                max_rows,
                max_bytes,
                poll,
                gather_rows,
                shuffle_indices=shuffle_indices,
            )
            for m, info in sorted(live.items())
        ]

    def _notify_commit(self) -> None:
        """Run the user's :meth:`~millstream.Reducer.on_commit`; its errors are only logged."""
        try:
            self.user.on_commit()
        except Exception as exc:
            self._note_error("on_commit", exc)

    def _rescale(self, size: int | None, limit: int | None, *, failed: bool = False) -> None:
        """Size the next fetch so that the transaction's writes stay below the store's limit.

        After a transaction that was too large, the fetch shrinks at least by half, and in
        proportion when the size at which it failed is known. After a commit that was capped
        below the full fetch, it grows in proportion to the room its writes left (at most
        fourfold, aiming at 90 % of the limit).
        """
        scale = self._fetch_scale
        ratio = 0.9 * limit / size if size and limit else None
        if failed:
            scale *= min(0.5, ratio) if ratio is not None else 0.5
        elif scale < 1.0 or (ratio is not None and ratio < 1.0):
            scale *= min(4.0, max(0.5, ratio)) if ratio is not None else 1.25
        self._fetch_scale = min(1.0, max(scale, 1e-9))

    def acknowledge(
        self, calls: list[GetRowsCall], committed: list[int], mappers: list[int]
    ) -> None:
        """Tell ``mappers`` right away what this reducer committed (GetRows for 0 rows).

        Without it a mapper learns of a commit only from the next GetRows, a commit
        interval later; with it the mapper frees the rows' memory and can persist its
        state and trim its input sooner. Failures are harmless (the next GetRows repeats
        the committed index) and ignored.
        """
        acks = [
            dataclasses.replace(
                call, committed_row_index=committed[call.mapper_index], max_rows=0, wait_seconds=0
            )
            for call in calls
            if call.mapper_index in mappers
        ]
        if acks:
            with self.time_spent.spent_on("mapper_wait"):
                self.rows_client.acknowledge_many(acks)

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
            for m, through in enumerate(committed):
                clear_spill(txn, self.index, m, through)
            txn.commit()
        except (RetryableStoreError, StoreUnavailableError) as exc:
            self._note_error("clearing committed spilled rows", exc)
        finally:
            txn.reset()

    def _with_spilled(self, batch: pa.RecordBatch, parts: list[pa.RecordBatch]) -> pa.RecordBatch:
        """``batch`` (the mappers' window rows) and spilled rows, as one batch."""
        tables = [pa.Table.from_batches([b]) for b in [*parts, batch] if b.num_columns]
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise UserCodeError(
                f"reducer {self.index}: spilled rows and the mappers' rows have incompatible "
                f"schemas ({exc}). Every mapper's map must return columns of compatible types"
            ) from exc
        return table.combine_chunks().to_batches()[0] if table.num_rows else batch

    def _decode(self, payloads: list[bytes], senders: list[int]) -> pa.RecordBatch:
        """One batch from every mapper's rows; differing schemas are unified if they can be.

        Raises:
            UserCodeError: The mappers' schemas cannot be unified (say which and how).
        """
        try:
            return _core.decode_ipc(payloads)
        except MillstreamError:
            if len(payloads) < 2:
                raise
        parts = [_core.decode_ipc([payload]) for payload in payloads]
        try:
            table = pa.concat_tables(
                [pa.Table.from_batches([part]) for part in parts], promote_options="permissive"
            )
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            described = "; ".join(
                f"mapper {m}: {part.schema.to_string(show_schema_metadata=False)}".replace(
                    "\n", ", "
                )
                for m, part in zip(senders, parts, strict=True)
            )
            raise UserCodeError(
                f"reducer {self.index} received rows with incompatible schemas ({exc}): "
                f"{described}. Every mapper's map must return columns of compatible types "
                "(the same names; types that widen to one, such as int64 and float64)"
            ) from exc
        return table.combine_chunks().to_batches()[0]

    def _user_code(self, call: Callable[[], object], what: str) -> None:
        """Run the user's ``reduce`` or ``process``; its errors (not the store's) become a
        :class:`UserCodeError` that says ``what`` and that nothing was committed."""
        try:
            with self.time_spent.spent_on("reduce"):
                call()
        except (RetryableStoreError, StoreUnavailableError, TransactionTooLargeError):
            raise
        except Exception as exc:
            raise UserCodeError(
                f"{what}: {exc!r}. Nothing of this batch was committed; fix the reducer and "
                "restart the processor"
            ) from exc

    def _reduce_and_commit(
        self,
        state: ReducerState,
        reduce: Callable[[StoreTransaction, StagedOutputs], Round | None],
        fetched: int,
        served_by: dict[int, str],
    ) -> bool:
        """Steps 5-8: reduce inside a transaction, re-check the state, write it, commit.

        ``reduce`` runs the user's code through the transaction and says what to commit
        with it (a :class:`Round`), or None to commit nothing (a queue reducer's round that
        finished and wrote nothing); ``fetched`` is the Arrow bytes the rows took.

        At least once, the transaction also checks that every mapper instance in
        ``served_by`` (mapper index: GUID of the instance that served its rows) still owns
        its mapper's numbering: rows of an instance a newer one took over from may be
        numbered differently from the newer one's, so they are not committed.
        ``consumed`` (mapper index: shuffle index) names spilled rows the batch holds:
        their chunks are cleared in the same transaction.

        The transaction replays itself into a new one when ``reduce`` runs longer than
        half the store's time limit (:class:`ReplayingTransaction`), so a slow ``reduce``
        commits instead of failing as too old for ever; its reads stay conflict-checked, and
        the re-read of the reducer's state below is one of them.
        """
        begun = self.clock.now()
        txn = ReplayingTransaction(self.store)
        outputs = self._staged_outputs()
        try:
            with self.time_spent.spent_on("store"), outputs.settled_with(txn):
                done = reduce(txn, outputs)
                if done is None:
                    txn.reset()
                    return False
                new, rows, consumed = done.state, done.rows, done.consumed
                if read_reducer_state(txn, self.index, self.processor.num_partitions) != state:
                    self.split_brains += 1
                    txn.reset()
                    return False
                if self.processor.at_least_once:
                    superseded = {
                        m: guid for m, guid in served_by.items() if read_numbering(txn, m) != guid
                    }
                    if superseded:
                        self.superseded_fetches += 1
                        log.info(
                            "reducer %d: rows of superseded mapper instances %s are not "
                            "committed; the instances that took over serve them again",
                            self.index,
                            superseded,
                        )
                        txn.reset()
                        return False
                write_reducer_state(txn, self.index, new)
                for m, through in consumed.items():
                    clear_spill(txn, self.index, m, through)
                txn.add(reduced_key(self.index, "rows"), rows)
                txn.add(reduced_key(self.index, "bytes"), fetched)
                txn.add(reduced_key(self.index, "commits"), 1)
                outputs.apply(txn)
                size = txn.write_size
                started = time.perf_counter()
                txn.commit()
                latency = time.perf_counter() - started
        except StoreConflictError:
            self.split_brains += 1
            return False
        except CommitUnknownResultError:
            self.unsettled.hold(outputs, ROUND, read=state)
            raise
        finally:
            self.renewals += txn.renewals
        self.unsettled.committed(ROUND, wrote=new)
        self._published(outputs)
        self.last_state = new
        self.last_write_size = size
        self.last_transaction_seconds = self.clock.now() - begun
        self.commits += 1
        if self.on_committed is not None:
            self.on_committed(latency, size, rows, fetched)
        self.rows_reduced += rows
        self.bytes_fetched += fetched
        return True

    def _note_error(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{what}: {type(exc).__name__}: {exc}"
        log.info("reducer %d: %s", self.index, self.last_error)

    def metrics(self) -> dict[str, float | int | str]:
        """Status figures for ``millstream status``."""
        committed = self.last_state.committed_row_indices if self.last_state else ()
        return {
            "guid": self.guid,
            "commits": self.commits,
            "rows_reduced": self.rows_reduced,
            "bytes_fetched": self.bytes_fetched,
            "split_brains": self.split_brains,
            "superseded_fetches": self.superseded_fetches,
            "rows_emitted": self.rows_emitted,
            "files_published": self.files_published,
            "renewals": self.renewals,
            **self.time_spent.figures(),
            "committed_row_indices": ",".join(map(str, committed)),
            "uptime": self.clock.now() - self.started_at,
            "errors": self.errors,
            "last_error": self.last_error[:500],
        }

    def finish(self) -> bool:
        """Once the processor drained: the user's ``drain`` committed once, then the outputs
        (:func:`millstream.workers.drain.finish`). Returns False after a conflict (call again).

        Raises:
            UserCodeError: ``drain`` raised; nothing of it was committed.
            RetryableStoreError, StoreUnavailableError: The store failed; call again later.
        """
        return drain.finish(self)

    def start_up(self) -> None:
        """What an instance reads before its first round: it publishes the files its
        predecessors' commits recorded, and learns whether this run is a rescale's (which
        ends at its cut, not at the processor's end: no drain).

        Raises:
            RetryableStoreError, StoreUnavailableError: The store failed; call again later.
        """
        finish_publishing(self.processor.outputs)
        with self.store.read() as txn:
            self.rescaling = read_rescale(txn) is not None

    def settle_unknown_commits(self) -> None:
        """Publish the files of earlier commits reported unknown that landed after all
        (:class:`~millstream.workers.settling.UnsettledOutputs`), and count them."""
        for outputs in self.unsettled.settle(self.store):
            self.rows_emitted += outputs.rows_appended
            self.files_published += outputs.files_staged

    def _staged_outputs(self) -> StagedOutputs:
        """What one transaction's user code sends to the processor's outputs."""
        return StagedOutputs(self.processor.outputs, f"reducer-{self.index}", self.index)

    def _published(self, outputs: StagedOutputs) -> None:
        """After a commit: publish its staged files and count what it sent."""
        outputs.publish()
        self.rows_emitted += outputs.rows_appended
        self.files_published += outputs.files_staged

    def run(self, stop: threading.Event) -> None:
        """Reduce until every mapper is drained or ``stop`` is set: the thin loop.

        Starts a round one interval after the start of the last round that committed
        (rows accumulate meanwhile and go into one transaction), the interval
        :class:`~millstream.workers.cadence.CommitCadence` says, unless the last
        fetch hit its row or byte cap, the mappers are behind (then they hold the next
        fetch until a full commit's worth of rows gathers, see :attr:`gathering`), or every
        mapper has drained; polls an
        idle processor less and less often, down to ten times a second; and backs off
        after errors (thesis 4.4.2 step 1).
        """
        t = self.tuning
        backoff = Backoff(t.backoff_seconds, t.backoff_max_seconds)
        idle = Backoff(t.idle_seconds, max(t.idle_seconds, min(0.1, t.commit_interval_seconds)))
        cadence = self.cadence
        last_start = self.clock.now() - cadence.interval  # of the last round that committed
        while not stop.is_set():
            try:
                self.start_up()
                break
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store, starting", exc)
                self.clock.sleep(backoff.next(), stop)
        while not stop.is_set():
            wait = cadence.interval - (self.clock.now() - last_start)
            while wait > 0 and not self.capped and not self.gathering and not stop.is_set():
                self.clock.sleep(min(wait, 0.1), stop)
                wait = cadence.interval - (self.clock.now() - last_start)
                if wait > 0 and self.drained_now():
                    break
            started = self.clock.now()
            try:
                committed = self.run_once()
            except UserCodeError as exc:
                if t.on_user_error == "stop":
                    raise
                self._note_error("reduce", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            try:
                if self.all_drained and (self.rescaling or self.finish()):
                    return
            except (RetryableStoreError, StoreUnavailableError) as exc:
                self._note_error("store, draining", exc)
                self.clock.sleep(backoff.next(), stop)
                continue
            if committed:
                backoff.reset()
                idle.reset()
                cadence.observe(self.last_transaction_seconds)
                last_start = started
            else:
                self.clock.sleep(idle.next(), stop)
