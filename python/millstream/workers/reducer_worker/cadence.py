"""How long a reducer lets rows gather between commits.

Every commit costs about the same whatever it holds: it rewrites the store pages its keys
touch and syncs the log. A fixed interval that suits a light stream makes a heavy one spend
most of its time committing, writing the same pages over and over. So the interval follows
the cost: a reducer keeps the share of its time spent in transactions (``reduce`` and the
commit) near ``Tuning.commit_time_share``, between ``commit_interval_seconds`` (a light
stream: low latency) and ``commit_max_interval_seconds`` (a heavy one: more rows folded into
each commit, as a micro-batch engine does when it falls behind).
"""

from __future__ import annotations

from millstream.tuning import Tuning


class CommitCadence:
    """The wait between a commit and the next, from the recent cost of a transaction."""

    def __init__(self, tuning: Tuning) -> None:
        self.least = tuning.commit_interval_seconds
        most = tuning.commit_max_interval_seconds
        self.most = max(self.least, 5 * self.least if most is None else most)
        self.share = tuning.commit_time_share
        self.cost = 0.0
        """Seconds of a recent transaction (reduce and commit), smoothed."""

    def observe(self, seconds: float) -> None:
        """Count a committed transaction that took ``seconds``."""
        self.cost = seconds if self.cost == 0.0 else 0.5 * self.cost + 0.5 * seconds

    @property
    def interval(self) -> float:
        """Seconds from the start of a round that committed to the start of the next round.

        Counted from the start, not from the commit's end: rows that reached the mappers
        while a round fetched and committed wait for one interval at most, not for the
        interval and the round's own time on top of it."""
        return min(self.most, max(self.least, self.cost / self.share))
