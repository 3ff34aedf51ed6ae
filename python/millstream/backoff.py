"""Backoff: how long to wait before trying again, growing with each failure.

One rule for every retry of the package: a wait that starts at ``initial``, doubles with
each failure and stops growing at ``maximum``. The store's retry loop jitters it (many
transactions may conflict at once); a worker's loop (:class:`Backoff`) and the local
runner's restarts use it as it is.
"""

from __future__ import annotations

import random

_MAX_DOUBLINGS = 64
"""Doublings past which the wait is the maximum whatever the numbers (no float overflow)."""


def exponential_delay(initial: float, maximum: float, failures: int) -> float:
    """The wait after ``failures`` earlier failures: ``initial * 2**failures``, at most
    ``maximum``."""
    return min(maximum, initial * 2.0 ** min(max(failures, 0), _MAX_DOUBLINGS))


def jittered(delay: float) -> float:
    """``delay`` spread uniformly over ``[delay/4, delay]``, so that retries that failed
    together do not all come back together."""
    return random.uniform(delay / 4, delay)


class Backoff:
    """The waits of one retrying loop: ``initial``, doubled per failure, capped at
    ``maximum``, back to ``initial`` after a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._failures = 0

    def next(self) -> float:
        """The wait before the next retry; doubles the one after."""
        delay = exponential_delay(self._initial, self._maximum, self._failures)
        self._failures += 1
        return delay

    def reset(self) -> None:
        """Back to the initial wait after a success."""
        self._failures = 0


__all__ = ["Backoff", "exponential_delay", "jittered"]
