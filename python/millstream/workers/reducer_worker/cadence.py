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

STEP = 0.1
"""The share of an interval by which rounds step back into line with the rows' arrivals
(:meth:`CommitCadence.counted_from`)."""


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

    def counted_from(self, started: float, first_answer: float | None) -> float:
        """Where the interval to the next round counts from, after a round that committed.

        A round whose first answer came later than a tenth of an interval after its start
        waited for rows: it counts from that answer, so that rows arriving about once an
        interval are taken as they come. A round whose rows were already there counts from
        a tenth of an interval before its start. Counting such rounds from their start
        alone lets the rounds drift against the arrivals (each one starts a little after
        its time, when its sleep ends): rows then wait for the next round for up to a whole
        interval, half of one on average, before the rounds fall into step again. Rounds
        whose rows are always there (a busy stream) start a tenth of an interval sooner
        than the interval.

        ``first_answer``: None when unknown (no fetch, or a client that does not time its
        answers): the round's start.
        """
        step = STEP * self.interval
        if first_answer is None:
            return started
        if first_answer > started + step:
            return first_answer
        return started - step
