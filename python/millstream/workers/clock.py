"""Time as the workers see it: real by default, controllable in simulations."""

from __future__ import annotations

import threading
import time
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


SYSTEM_CLOCK = SystemClock()
