"""The plain round: a :class:`~millstream.Reducer`'s fetch, ``reduce`` and commit."""

from __future__ import annotations

import dataclasses

from millstream.api import Transaction
from millstream.exceptions import (
    TransactionTooLargeError,
    TransactionTooOldError,
    UserCodeError,
)
from millstream.ledger import ReducerState, WorkerInfo
from millstream.ledger.dead_letters import DeadLetter
from millstream.outputs import StagedOutputs
from millstream.rpc.calls import GetRowsResult, NotAnsweredYet
from millstream.state import StoreTransaction
from millstream.workers.reducer_worker.fetch import Fetching
from millstream.workers.reducer_worker.ipc_decode import decode_rows
from millstream.workers.reducer_worker.reduce_dead_letters import Origin, ReduceDeadLetters
from millstream.workers.reducer_worker.round_record import Round
from millstream.workers.reducer_worker.spill_reads import SpillReads


class PlainRound(Fetching, SpillReads, ReduceDeadLetters):
    """The plain reducer's round (a part of :class:`ReducerWorker`)."""

    def _run_plain_round(self, state: ReducerState, live: dict[int, WorkerInfo]) -> bool:
        """One round of a plain reducer (thesis 4.4.2 steps 3-8): fetch from the live
        mappers after the committed indices, add the rows they spilled, ``reduce`` them
        and commit. Returns whether a batch was committed.

        Mappers that fail to answer are skipped this round (their committed index stays).
        With ``on_user_error="dead_letter"``, a ``reduce`` that raises is bisected and the
        round committed again without the rows it raises on, with their dead letters
        (:mod:`.reduce_dead_letters`).
        """
        calls = self._round_calls(state, live)
        if not calls and not self._spill_pending:
            return self._run_timer(state)
        _, max_bytes = self._caps(len(live))
        results = self._get_rows(calls)
        answered = [result for result in results if isinstance(result, GetRowsResult)]
        if answered:
            self.behind = any(result.behind for result in answered)
            rows = sum(result.row_count for result in answered)
            if rows:
                self.fetch_sizing.row_bytes = (
                    sum(len(result.arrow_ipc) for result in answered) / rows
                )
        self.capped = any(
            isinstance(result, GetRowsResult)
            and (result.row_count >= call.max_rows or len(result.arrow_ipc) >= call.max_bytes // 2)
            for call, result in zip(calls, results, strict=True)
        )
        new = list(state.committed_row_indices)
        payloads: list[bytes] = []
        ranges: list[str] = []
        senders: list[int] = []
        counts: list[int] = []
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
            counts.append(result.row_count)
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
                del senders[at], payloads[at], ranges[at], counts[at]
            new[m] = last
            ranges.append(
                f"mapper {m} spilled shuffle rows ({state.committed_row_indices[m]}, {last}]"
            )
            self.capped = self.capped or size >= max_bytes
        if not payloads and not spilled:
            return self._run_timer(state)
        batch = decode_rows(self.index, payloads, senders)
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

        rows = batch.num_rows
        what = f"reduce of reducer {self.index} raised on {rows} rows ({'; '.join(ranges)})"
        letters: list[DeadLetter] = []

        def reduce(txn: StoreTransaction, outputs: StagedOutputs) -> Round:
            if batch.num_rows:
                self._user_code(lambda: self.user.reduce(batch, Transaction(txn, outputs)), what)
            if letters:
                self.record_reduce_dead_letters(txn, letters, rows)
            return Round(ReducerState(tuple(new)), rows, consumed)

        try:
            while True:
                try:
                    committed = self._reduce_and_commit(
                        state,
                        reduce,
                        sum(map(len, payloads)),
                        {m: served_by[m] for m in senders},
                        # Several rows are split when too large: one row cannot be.
                        splittable=batch.num_rows > 1,
                    )
                    break
                except UserCodeError as exc:
                    cause = self.bisectable(exc, bool(letters))
                    if cause is None:
                        raise
                    origins: list[Origin] = [
                        (m, state.committed_row_indices[m] + 1, part.num_rows)
                        for m, (part, _, _) in spilled.items()
                    ]
                    origins += [
                        (m, state.committed_row_indices[m] + 1, count)
                        for m, count in zip(senders, counts, strict=True)
                    ]
                    batch, letters = self.split_off_dead_letters(batch, origins, cause, what)
        except (TransactionTooLargeError, TransactionTooOldError) as exc:
            if batch.num_rows <= 1 and isinstance(exc, TransactionTooLargeError):
                raise TransactionTooLargeError(
                    f"reducer {self.index}: the writes of reduce for one row "
                    f"({'; '.join(ranges)}) exceed the store's transaction limits: {exc}. "
                    "Write less per row (FoundationDB: 10 MB and 5 s per transaction)"
                ) from exc
            self.fetch_sizing.resize(
                getattr(exc, "size", None), getattr(exc, "limit", None), failed=True
            )
            if isinstance(exc, TransactionTooOldError):
                self._note_error(
                    "commit",
                    TransactionTooOldError(
                        f"reducer {self.index}: the store operations of one commit "
                        f"({batch.num_rows} rows: {'; '.join(ranges)}) took longer than the "
                        "transaction limit even replayed into a new transaction after reduce "
                        f"(reduce itself may take as long as it needs); fetching fewer rows "
                        f"next time (scale {self.fetch_sizing.scale:.3g}): {exc}"
                    ),
                )
                return False
            self._note_error("commit", exc)
            return False
        if committed:
            self.dead_letters += len(letters)
            # The user hears of the commit first: telling the mappers of it takes calls.
            self._notify_commit()
            self.fetch_sizing.resize(self.last_commit_size, self.store.limits.max_transaction_bytes)
            if self.tuning.acknowledge_commits and not self._send_next_round(
                ReducerState(tuple(new)), live
            ):
                self.acknowledge(calls, new, senders)
        return committed

    def _run_timer(self, state: ReducerState) -> bool:
        """After a round that fetched no rows: the user's ``on_timer`` if ``timer_due``,
        committed with the unchanged committed indices. Returns whether it committed."""
        if not self.user.timer_due():
            return False

        def on_timer(txn: StoreTransaction, outputs: StagedOutputs) -> Round | None:
            what = f"on_timer of reducer {self.index} raised"
            self._user_code(lambda: self.user.on_timer(Transaction(txn, outputs)), what)
            if txn.write_size == 0 and outputs.empty:
                return None
            return Round(state, 0, {})

        committed = self._reduce_and_commit(state, on_timer, 0, {})
        if committed:
            self._notify_commit()
        return committed
