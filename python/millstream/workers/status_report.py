"""What ``millstream status`` shows: lag behind the end of the input, and recent rates.

Workers publish these figures with their heartbeat. Lag is what users mean by it: the rows
of a mapper's input partition that are not yet committed (a queue's end index, a log's
total rows, minus the mapper's persisted input index), not the rows in flight. Rates are
over the last :data:`RATE_SPAN_SECONDS`, not averages over the worker's lifetime.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from millstream.ledger import REDUCER_ACTIVITIES, Metric

if TYPE_CHECKING:
    from millstream.inputs.base import Input

log = logging.getLogger("millstream.workers")

RATE_SPAN_SECONDS = 10.0
"""How far back the published rates look."""


class RecentRates:
    """Per-second rates of growing counters over the last ``span`` seconds."""

    def __init__(
        self, span: float = RATE_SPAN_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._span = span
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def update(self, counters: Mapping[str, float]) -> dict[str, float]:
        """Record the counters now; ``<name>_per_second`` for each over the recent span."""
        now = self._clock()
        self._samples.append((now, dict(counters)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._span:
            self._samples.popleft()
        then, old = self._samples[0]
        elapsed = now - then
        return {
            f"{name}_per_second": (value - old.get(name, 0.0)) / elapsed if elapsed > 0 else 0.0
            for name, value in counters.items()
        }


def _end_of(source: Any, partition: int) -> int | None:
    end = getattr(source, "end_row_index", None)
    if end is None:
        return None
    try:
        return int(end(partition))
    except Exception as exc:  # a status figure must never stop a worker
        log.debug("end of input partition %d unknown: %s", partition, exc)
        return None


class MapperStatus:
    """A mapper's status: its own figures, its lag and its recent rates.

    Inputs that know where their partitions end (``end_row_index(partition)``, as
    :class:`~millstream.inputs.ParquetLog` and :class:`~millstream.inputs.StoreQueue` do)
    get ``partition_end_row_index`` and ``lag_rows``.
    """

    def __init__(
        self, metrics: Callable[[], dict[str, Metric]], source: Input, partition: int
    ) -> None:
        self._metrics = metrics
        # A copy of its own: the heartbeat thread must not share the ingestion thread's
        # readers or store connections.
        try:
            self._source: Any = pickle.loads(pickle.dumps(source))
        except Exception as exc:  # an input that does not copy shows no lag
            log.debug("mapper %d: no lag figures, the input does not copy: %s", partition, exc)
            self._source = None
        self._partition = partition
        self._rates = RecentRates()

    def __call__(self) -> dict[str, Metric]:
        figures: dict[str, Metric] = dict(self._metrics())
        persisted = int(figures.get("persisted_input_unread_row_index", 0))
        rates = self._rates.update(
            {"rows_read": float(figures.get("rows_read", 0)), "rows_persisted": persisted}
        )
        figures.update(rates)
        end = _end_of(self._source, self._partition)
        if end is not None:
            end = max(end, persisted)
            figures["partition_end_row_index"] = end
            figures["lag_rows"] = end - persisted
        return figures


class TimeSpent:
    """Seconds of real time a worker's loop spent on each of ``activities``.

    A span timed inside another (``reduce`` inside a commit's ``store`` time) counts for
    the inner activity only. Published as ``seconds_<activity>`` counters; their recent
    rates (seconds per second) are the shares of the worker's time, what ``millstream
    status`` shows. Read from the heartbeat thread while the loop adds to it: each figure
    is a float written whole.
    """

    def __init__(self, *activities: str, clock: Callable[[], float] = time.perf_counter) -> None:
        self.seconds = dict.fromkeys(activities, 0.0)
        self._clock = clock
        self._open: list[tuple[str, float]] = []  # the spans under way, innermost last
        self._reported: dict[str, float] = {}
        self._reporting = threading.Lock()  # the heartbeat's and a final status's readers

    @contextmanager
    def spent_on(self, activity: str) -> Iterator[None]:
        """Count the time inside the block for ``activity``."""
        now = self._clock()
        if self._open:
            outer, since = self._open[-1]
            self.seconds[outer] += now - since
        self._open.append((activity, now))
        try:
            yield
        finally:
            now = self._clock()
            _, since = self._open.pop()
            self.seconds[activity] += now - since
            if self._open:
                self._open[-1] = (self._open[-1][0], now)

    def figures(self) -> dict[str, float]:
        """``seconds_<activity>`` for each activity, the span under way counted so far (a
        ``reduce`` of minutes shows while it runs). Called from another thread than the
        loop's: a span that ends while this reads may be missed once, so each figure is
        kept at least at what it was last time (the counters never go back)."""
        seconds = dict(self.seconds)
        running = self._open[-1:]  # one read: the loop may end the span meanwhile
        if running:
            activity, since = running[0]
            seconds[activity] += max(0.0, self._clock() - since)
        with self._reporting:
            for activity, value in seconds.items():
                self._reported[activity] = max(value, self._reported.get(activity, 0.0))
            return {f"seconds_{activity}": value for activity, value in self._reported.items()}


class ReducerStatus:
    """A reducer's status: its own figures, recent rates (rows, commits, and the shares of
    its time in each activity of :data:`REDUCER_ACTIVITIES`) and when it last committed
    (as seen by the heartbeat: within one heartbeat period)."""

    def __init__(
        self, metrics: Callable[[], dict[str, Metric]], wall: Callable[[], float] = time.time
    ) -> None:
        self._metrics = metrics
        self._wall = wall
        self._rates = RecentRates()
        self._commits = 0
        self._last_commit = 0.0

    def __call__(self) -> dict[str, Metric]:
        figures: dict[str, Metric] = dict(self._metrics())
        commits = int(figures.get("commits", 0))
        if commits != self._commits:
            self._commits, self._last_commit = commits, self._wall()
        figures.update(
            self._rates.update(
                {
                    "rows_reduced": float(figures.get("rows_reduced", 0)),
                    "commits": float(commits),
                }
                | {
                    f"seconds_{activity}": float(figures.get(f"seconds_{activity}", 0))
                    for activity in REDUCER_ACTIVITIES
                }
            )
        )
        if self._last_commit:
            figures["last_commit_time"] = self._last_commit
        return figures


__all__ = [
    "RATE_SPAN_SECONDS",
    "MapperStatus",
    "RecentRates",
    "ReducerStatus",
    "TimeSpent",
]
