"""Pipelines: several processors run side by side on this machine until all of them drain."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from millstream.exceptions import ConfigurationError
from millstream.ledger import RunSummary
from millstream.runner.local import LocalRunner
from millstream.runner.signals import RunStopped, signals_stop_the_run

if TYPE_CHECKING:
    from millstream.processor import Processor


class PipelineRunner:
    """Runs several processors side by side on this machine, each as :class:`LocalRunner`
    runs one, until all of them drain.

    For a pipeline: a processor whose reducers append to a
    :class:`~millstream.inputs.StoreQueue` (declared in its ``outputs``) feeds the processor
    that reads that queue, exactly once; when the first drains, it seals the queue, so the
    second drains after it.

    Args:
        processors: The stages; their names must differ (each one's state lives under
            its name).
        progress: Print each stage's progress lines about once a second (to ``out``).
        out: Where progress goes.

    Attributes:
        runners: One :class:`LocalRunner` per processor, in the order given.
    """

    def __init__(
        self, processors: Sequence[Processor], *, progress: bool = False, out: TextIO = sys.stderr
    ) -> None:
        names = [p.name for p in processors]
        if len(set(names)) != len(names):
            raise ConfigurationError(
                "the processors of a pipeline need distinct names (each one's state lives "
                f"under its name); got {names}"
            )
        self.progress = progress
        self.runners = [LocalRunner(p, progress=progress, out=out, label=True) for p in processors]

    def start(self) -> None:
        """Start every processor's workers."""
        for runner in self.runners:
            runner.start()

    def wait(self, timeout: float | None = None) -> list[RunSummary]:
        """Supervise until every processor drained; their summaries, in order.

        Raises:
            TimeoutError: Not every processor drained within ``timeout`` seconds.
            RunStopped: SIGINT or SIGTERM arrived (every worker of every processor stopped).
            UserCodeError, CrashLoopError, ...: As :meth:`LocalRunner.poll` (every worker
                of every processor is stopped first).
        """
        summaries: list[RunSummary | None] = [None] * len(self.runners)
        deadline = None if timeout is None else time.monotonic() + timeout
        last_report = time.monotonic()
        try:
            with signals_stop_the_run():
                while any(summary is None for summary in summaries):
                    for i, runner in enumerate(self.runners):
                        if summaries[i] is None and runner.poll():
                            summaries[i] = runner.finish()
                    now = time.monotonic()
                    if deadline is not None and now > deadline:
                        waiting = [
                            r.processor.name
                            for r, s in zip(self.runners, summaries, strict=True)
                            if s is None
                        ]
                        raise TimeoutError(f"processors {waiting} did not drain within {timeout} s")
                    if self.progress and now - last_report >= 1.0:
                        last_report = now
                        for runner, summary in zip(self.runners, summaries, strict=True):
                            if summary is None:
                                runner._report()
                    time.sleep(0.05)
        except KeyboardInterrupt as exc:
            self.stop()
            signum = exc.signum if isinstance(exc, RunStopped) else signal.SIGINT
            raise RunStopped(signum) from None
        except BaseException:
            self.stop()
            raise
        return [summary for summary in summaries if summary is not None]

    def run(self, timeout: float | None = None) -> list[RunSummary]:
        """Start, supervise until every processor drained, and return the summaries."""
        with signals_stop_the_run():
            self.start()
            return self.wait(timeout)

    def stop(self) -> None:
        """Stop every worker of every processor."""
        for runner in self.runners:
            runner.stop()


def run_local_pipeline(
    processors: Sequence[Processor],
    *,
    progress: bool = False,
    timeout: float | None = None,
) -> list[RunSummary]:
    """Run several processors side by side on this machine until all of them drain.

    A pipeline: each processor's reducers may append to a queue another one reads (see
    :class:`PipelineRunner`). Each processor is supervised as :func:`run_local` does
    (restarts, errors, Ctrl-C stops them all).

    Returns:
        One summary per processor, in the order given.

    Raises:
        TimeoutError: Not every processor drained within ``timeout`` seconds.
        RunStopped: SIGINT or SIGTERM arrived.
    """
    return PipelineRunner(processors, progress=progress).run(timeout)


__all__ = ["PipelineRunner", "run_local_pipeline"]
