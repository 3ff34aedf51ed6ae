"""The queue reducer's round (:class:`~millstream.QueueReducer`): rows fetched once into
pending rows (:mod:`.pending_queue`), ``process`` over every pending row, and a commit of the
finished prefix per mapper with what it wrote. The state only a queue reducer keeps lives
here, in its :class:`QueueRound`."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from millstream import _core
from millstream.api import Transaction
from millstream.exceptions import TransactionTooLargeError, TransactionTooOldError, UserCodeError
from millstream.ledger import ReducerState, WorkerInfo
from millstream.ledger.dead_letters import DeadLetter
from millstream.outputs import StagedOutputs
from millstream.queue_reducer import PendingRows, QueueReducer
from millstream.rpc.calls import GetRowsResult, NotAnsweredYet
from millstream.state import StoreTransaction
from millstream.workers.reducer_worker.pending_dead_letters import PendingDeadLetters
from millstream.workers.reducer_worker.pending_queue import PendingQueue
from millstream.workers.reducer_worker.round_record import Round

if TYPE_CHECKING:
    from millstream.workers.reducer_worker.worker import ReducerWorker

log = logging.getLogger("millstream.reducer")


class QueueRound:
    """A queue reducer's rounds and the state they keep between them.

    Args:
        num_partitions: The processor's input partitions (the mappers rows come from).
    """

    def __init__(self, num_partitions: int) -> None:
        self.pending = PendingQueue(num_partitions)
        """The rows fetched and not committed."""
        self._ended: set[int] = set()
        """Mappers that said the reducer has fetched the last of their rows."""
        self._told_ended: frozenset[int] | None = None
        """The ended mappers the last ``process`` was told of."""
        self._warned_memory = False
        self._pending_share = 1.0
        """The share of each mapper's pending rows ``process`` sees (below 1 after a round
        too large for one transaction)."""
        self.poison_rows = PendingDeadLetters()
        """The pending rows ``process`` raised on (``on_user_error="dead_letter"``)."""
        self._view_cut = False
        """Whether the last ``process`` saw only part of the pending rows (then the next
        round shows it the rest, whatever arrived)."""

    def run(
        self,
        worker: ReducerWorker,
        state: ReducerState,
        live: dict[int, WorkerInfo],
        drained: set[int],
    ) -> bool:
        """One round of a queue reducer: fetch the rows after the fetch positions, give
        every pending row to ``process``, commit the finished prefix per mapper with what
        it wrote. Returns whether a transaction was committed.

        ``process`` runs when rows arrived, the ended mappers changed, the last round's
        commit failed, or the reducer's :meth:`~millstream.Reducer.timer_due` says time
        passed; a round that finishes and writes nothing commits nothing.
        """
        queue = self.pending
        changed = queue.follow(state.committed_row_indices)
        max_rows, max_bytes = worker._caps(len(live))
        poll = min(worker.tuning.get_rows_poll_seconds, worker.tuning.rpc_timeout_seconds / 2)
        calls = [
            dataclasses.replace(call, after_row_index=queue.fetched[call.mapper_index])
            for call in worker._calls(state, live, max_rows, max_bytes, poll, shuffle_indices=True)
        ]
        results = worker._get_rows(calls)
        answers: dict[int, GetRowsResult] = {}
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, NotAnsweredYet):
                continue
            if not isinstance(result, GetRowsResult):
                worker._note_error(f"GetRows from mapper {call.mapper_index}", result)
                continue
            if call.after_row_index == queue.fetched[call.mapper_index]:
                answers[call.mapper_index] = result
        worker.capped = any(
            result.row_count >= max_rows or len(result.arrow_ipc) >= max_bytes // 2
            for result in answers.values()
        )
        # Spilled rows come before the window's (see run_once): a mapper with some has its
        # answer used in a later round.
        spill_waits, spilled = worker._read_spilled(tuple(queue.fetched), max_bytes, indices=True)
        if spill_waits and not spilled:
            worker._clear_stale_spill(state.committed_row_indices)
        arrived = 0
        for m, (rows, _, size) in spilled.items():
            answers.pop(m, None)
            arrived += queue.add(m, rows)
            worker.capped = worker.capped or size >= max_bytes
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
            arrived
            or changed
            or ended != self._told_ended
            or self._view_cut
            or worker.user.timer_due()
        ):
            return False
        pending = queue.view(ended, self._pending_share)
        self._view_cut = len(pending) < len(queue)
        self._told_ended = None  # until this round's commit settles
        self._warn_if_pending_fills_memory(pending, worker)

        user = worker.user
        assert isinstance(user, QueueReducer)
        # A rescale's run ends at its cut, not at the processor's end: once every input
        # ended there the rows are handed over; until then no input has ended for process.
        handing_over = (
            worker.rescaling and len(pending.ended_partitions) == worker.processor.num_partitions
        )
        if worker.rescaling and not handing_over:
            pending.ended_partitions = frozenset()
        step = user.hand_over if handing_over else user.process
        what = f"{step.__name__} of reducer {worker.index} raised on {len(pending)} pending rows"
        dead = self.poison_rows
        aside = dead.set_aside(queue, pending)
        letters: list[DeadLetter] = []

        def process(txn: StoreTransaction, outputs: StagedOutputs) -> Round | None:
            whole, seen, kept = dead.without(pending, aside)
            worker._user_code(lambda: step(seen, Transaction(txn, outputs)), what)
            dead.finish_aside(whole, seen, kept, aside)
            prefix = whole.finished_prefix()
            letters[:] = dead.letters(queue, whole, aside, worker.index)
            if letters:
                worker.record_reduce_dead_letters(txn, letters, sum(prefix.values()))
            new = queue.committed_after(prefix)
            if new == state.committed_row_indices and txn.write_size == 0 and outputs.empty:
                self._told_ended = ended  # nothing to commit: the round is settled
                self._pending_share = min(1.0, self._pending_share * 2)  # it wrote nothing
                return None
            consumed = dict(enumerate(new)) if spill_waits or spilled else {}
            return Round(ReducerState(new), sum(prefix.values()), consumed)

        try:
            bisected = False
            while True:
                try:
                    committed = worker._reduce_and_commit(state, process, fetched_bytes, {})
                    break
                except UserCodeError as exc:
                    cause = worker.bisectable(exc, bisected)
                    if cause is None:
                        raise
                    dead.bisect(worker, queue, pending, aside, step, cause, what)
                    aside, bisected = dead.set_aside(queue, pending), True
        except (TransactionTooLargeError, TransactionTooOldError) as exc:
            if len(pending) <= 1 and isinstance(exc, TransactionTooLargeError):
                raise TransactionTooLargeError(
                    f"reducer {worker.index}: the writes of process for one pending row exceed "
                    f"the store's transaction limits: {exc}. Write less per round "
                    "(FoundationDB: 10 MB and 5 s per transaction)"
                ) from exc
            # The next rounds see a smaller prefix of each mapper's pending rows.
            self._pending_share /= 2
            worker._note_error(
                "commit",
                type(exc)(
                    f"reducer {worker.index}: the round over {len(pending)} pending rows was too "
                    f"large for one transaction; process sees the first "
                    f"{self._pending_share:.3g} of each mapper's pending rows next: {exc}"
                ),
            )
            return False
        if committed:
            self._pending_share = min(1.0, self._pending_share * 2)
        if committed and worker.last_state is not None:
            worker.dead_letters += len(letters)
            dead.forget(worker.last_state.committed_row_indices)
            queue.follow(worker.last_state.committed_row_indices)
            self._told_ended = ended
            worker._notify_commit()
            if worker.tuning.acknowledge_commits:
                worker.acknowledge(calls, list(worker.last_state.committed_row_indices), list(live))
        return committed

    def _warn_if_pending_fills_memory(self, pending: PendingRows, worker: ReducerWorker) -> None:
        """Log once when the pending rows take half the mappers' memory: they stay in the
        mappers' windows, and a mapper whose window is full reads no more input, so a
        reducer waiting for later rows to finish these (a watermark) would wait for ever."""
        held = pending.rows.nbytes
        limit = worker.tuning.memory_limit_bytes
        if self._warned_memory or 2 * held < limit:
            return
        self._warned_memory = True
        log.warning(
            "reducer %d: its %d pending rows take %d bytes, half of or more than the mappers' "
            "tuning.memory_limit_bytes (%d): a mapper whose window fills reads no more input "
            "until rows are finished. Finish rows sooner, raise memory_limit_bytes, or keep "
            "state in the store instead (ms.event_time.PaneReducer for event-time panes)",
            worker.index,
            len(pending),
            held,
            limit,
        )
