"""Fetch: a reducer round's GetRows to the live mappers (thesis 4.4.2 step 3), how many
gathering a backlog, and telling the
mappers of a commit (acknowledgements, or the next round's calls sent at once). How much
each fetch asks for: :mod:`.fetch_sizing`."""

from __future__ import annotations

import dataclasses

from millstream.ledger import ReducerState, WorkerInfo
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.workers.reducer_worker.instance import ReducerInstance


class Fetching(ReducerInstance):
    """The reducer's fetch steps (a part of :class:`ReducerWorker`)."""

    def _get_rows(self, calls: list[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        """This round's answers (thesis 4.4.2 step 3), timed as waiting for the mappers."""
        if not calls:
            return []
        with self.time_spent.spent_on("mapper_wait"):
            results = self.rows_client.get_rows_many(calls)
        self.first_answer_at = self.rows_client.first_answer_at
        return results

    def _caps(self, live: int) -> tuple[int, int]:
        """Rows and bytes to ask each of ``live`` mappers for in this transaction."""
        t = self.tuning
        scale = self.fetch_sizing.scale
        rows = max(1, int(t.commit_max_rows * scale) // max(1, live))
        size = max(1, min(t.get_rows_max_bytes, int(t.commit_max_bytes * scale) // max(1, live)))
        return rows, size

    @property
    def gathering(self) -> bool:
        """Whether the next fetch lets the mappers gather a full commit's worth of rows
        (:attr:`~millstream.Tuning.gather_seconds`) instead of following the cadence."""
        return self.behind and self.tuning.gather_seconds > 0 and self.queue_round is None

    def _gather_rows(self, max_rows: int, max_bytes: int) -> int:
        """Rows each mapper should gather for this reducer before answering (0: none)."""
        if not self.gathering:
            return 0
        if self.fetch_sizing.row_bytes <= 0:
            return max_rows
        return max(1, min(max_rows, int(max_bytes / self.fetch_sizing.row_bytes)))

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
