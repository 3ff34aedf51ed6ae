"""The reducer's figures: its counters and errors as ``millstream status`` and the metrics
show them."""

from __future__ import annotations

from millstream.workers.reducer_worker.instance import ReducerInstance


class ReducerFigures(ReducerInstance):
    """The reducer's status figures (a part of :class:`ReducerWorker`)."""

    def metrics(self) -> dict[str, float | int | str]:
        """Status figures for ``millstream status`` (the user reducer's own first, so that
        they cannot hide the worker's)."""
        committed = self.last_state.committed_row_indices if self.last_state else ()
        return {
            **self.user.figures(),
            "guid": self.guid,
            "commits": self.commits,
            "rows_reduced": self.rows_reduced,
            "bytes_fetched": self.bytes_fetched,
            "split_brains": self.split_brains,
            "superseded_fetches": self.superseded_fetches,
            "rows_emitted": self.rows_emitted,
            "files_published": self.files_published,
            "dead_letters": self.dead_letters,
            "renewals": self.renewals,
            **self.time_spent.figures(),
            "committed_row_indices": ",".join(map(str, committed)),
            "uptime": self.clock.now() - self.started_at,
            "errors": self.errors,
            "last_error": self.last_error[:500],
        }
