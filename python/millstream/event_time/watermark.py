"""The event-time watermark, and the idle input partitions that stop holding it.

A pane closes when the watermark, the smallest latest event time over the input
partitions that may still send rows, passes its end by the lateness. A partition that
stops sending rows would hold every pane open for ever; with ``Panes(idle_timeout=...)``,
a partition whose latest event time has not advanced for that many seconds of the
reducer's clock no longer counts, until it advances again. When every partition is idle
the watermark is the latest event time any of them reported (as Flink's, when its last
active input turns idle): every partition has been silent that long, so the panes they
filled close.

A partition turns idle on the clock, not on a row: after a round that fetched no rows the
reducer's loop asks :meth:`~millstream.Reducer.timer_due`, which is true once a
partition's timeout has run out (:meth:`IdlePartitions.due`), and the pane reducers then
compute the watermark again with no new row (:meth:`~millstream.Reducer.on_timer`, or
``process`` over the pending rows). The loop's own waits between rounds pace it: nothing
polls the clock.

Which partition is idle depends on when the reducer looks, so it is not replayed
exactly; what the decision leads to is: a pane is emitted in the commit that records the
watermark it closed at, and once committed it is never changed or emitted again. A row
that comes afterwards for it, from the idle partition or any other, is late (counted, and
sent to ``Panes.late_output``), never lost. A reducer that restarts forgets the clocks and
waits a whole timeout again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet

END_OF_TIME = 2**62
"""The watermark once every partition's input ended: past every pane (and still adds
safely)."""


class IdlePartitions:
    """Tells which input partitions have had no new latest event time for ``timeout``
    seconds (None: none ever is)."""

    def __init__(self, timeout: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._started: float | None = None
        self._seen: dict[int, tuple[int, float]] = {}  # partition: (latest time, since)
        self._next: float | None = None
        """When the next partition the last :meth:`idle` counted as active turns idle."""

    def idle(self, marks: Mapping[int, int], partitions: Iterable[int]) -> frozenset[int]:
        """Of ``partitions``, those whose latest event time in ``marks`` (partition:
        time; a partition absent has reported nothing) has not changed for the timeout,
        counted from the first call for a partition that never reported."""
        if self._timeout is None:
            return frozenset()
        now = self._clock()
        if self._started is None:
            self._started = now
        for p, t in marks.items():
            seen = self._seen.get(p)
            if seen is None or seen[0] != t:
                self._seen[p] = (t, now)
        started = self._started
        since = {p: self._seen.get(p, (0, started))[1] for p in partitions}
        active = [t + self._timeout for t in since.values() if now - t < self._timeout]
        self._next = min(active, default=None)
        return frozenset(p for p, t in since.items() if now - t >= self._timeout)

    def due(self) -> bool:
        """Whether a partition the last :meth:`idle` counted as active has turned idle since
        (by the clock alone: the watermark would change with no new row)."""
        return self._next is not None and self._clock() >= self._next


def watermark(
    marks: Mapping[int, int], partitions: int, ended: AbstractSet[int], idle: IdlePartitions
) -> int | None:
    """The smallest latest event time (``marks``: partition to time) over the
    ``partitions`` whose input has not ended and that are not idle; the largest of theirs
    when every one is idle; None while one that counts has reported nothing (or every one
    is idle and none reported); :data:`END_OF_TIME` once every input ended."""
    waiting = [p for p in range(partitions) if p not in ended]
    if not waiting:
        return END_OF_TIME
    resting = idle.idle(marks, waiting)
    holding = [p for p in waiting if p not in resting]
    if not holding:
        return max((marks[p] for p in waiting if p in marks), default=None)
    if any(p not in marks for p in holding):
        return None
    return min(marks[p] for p in holding)


__all__ = ["END_OF_TIME", "IdlePartitions", "watermark"]
