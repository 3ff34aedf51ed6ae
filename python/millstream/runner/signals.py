"""How a local run is stopped from outside: SIGINT (Ctrl-C) or SIGTERM end it with
:class:`RunStopped` after every worker has exited."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from millstream.ledger import RunSummary


class RunStopped(KeyboardInterrupt):
    """A local run was stopped by SIGINT (Ctrl-C) or SIGTERM; every worker has exited.

    Attributes:
        signum: The signal that stopped it.
        summary: What the run did until then (``drained`` is False).
    """

    def __init__(self, signum: int, summary: RunSummary | None = None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.summary = summary


@contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """SIGTERM raises :class:`RunStopped` (SIGINT already raises KeyboardInterrupt).

    Only in the main thread (Python delivers signals there); elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum: int, _frame: object) -> None:
        raise RunStopped(signum)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["RunStopped", "signals_stop_the_run"]
