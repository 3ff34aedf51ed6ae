"""Time as the workers see it: real by default, controllable in simulations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """A source of time and of waiting."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def wall(self) -> float:
        """Unix time in seconds (heartbeats)."""
        ...

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Wait ``seconds``, returning early when ``stop`` is set."""
        ...

    def wait(
        self,
        block: Callable[[float], object],
        seconds: float,
        stop: threading.Event | None = None,
    ) -> None:
        """Wait at most ``seconds`` in ``block``, a function that blocks at most the time
        it is given and returns early when what it waits for happened (rows arrived)."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()

    def wall(self) -> float:
        """Unix time."""
        return time.time()

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Sleep, waking early when ``stop`` is set."""
        if stop is None:
            time.sleep(seconds)
        else:
            stop.wait(seconds)

    def wait(
        self,
        block: Callable[[float], object],
        seconds: float,
        stop: threading.Event | None = None,
    ) -> None:
        """Block in ``block`` at most ``seconds`` (not at all once ``stop`` is set)."""
        if stop is None or not stop.is_set():
            block(seconds)


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that only moves when told to (simulations and tests).

    ``sleep`` advances the time instead of waiting, so loops driven by it run instantly.
    """

    def __init__(self, start: float = 0.0, wall_offset: float = 1.7e9) -> None:
        self._now = start
        self._wall_offset = wall_offset

    def now(self) -> float:
        """The current simulated time."""
        return self._now

    def wall(self) -> float:
        """Simulated Unix time."""
        return self._wall_offset + self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += seconds

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Advance by ``seconds`` without waiting."""
        self._now += max(0.0, seconds)

    def wait(
        self,
        block: Callable[[float], object],
        seconds: float,
        stop: threading.Event | None = None,
    ) -> None:
        """Advance by ``seconds`` without blocking (nothing arrives in simulated time
        unless the simulation makes it arrive)."""
        self._now += max(0.0, seconds)
