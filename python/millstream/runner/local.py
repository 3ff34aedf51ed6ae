"""The local runner: one OS process per worker on this machine, supervised and restarted
when it dies (:class:`LocalRunner`, :func:`run_local`).

What each worker process runs is :mod:`millstream.runner.child`; several processors side by
side, :mod:`millstream.runner.pipeline`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, TextIO

from millstream.exceptions import ConfigurationError, CrashLoopError, MillstreamError
from millstream.ledger import RunSummary, prepare_store, read_status, summarize
from millstream.rpc.address import LOOPBACK, check_exposure, mapper_address
from millstream.rpc.tls import tls_files
from millstream.runner.child import (
    EXIT_CONFIG_ERROR,
    EXIT_USER_ERROR,
    child_main,
    describe_error,
    dump_processor,
    error_class,
)
from millstream.runner.forkserver import (
    IN_WORKER_ENV,
    WorkerContext,
    main_module_hidden,
    running_fork_server,
    start_fork_server,
    worker_context,
)
from millstream.runner.metrics_server import MetricsServer
from millstream.runner.placement import WorkerHost
from millstream.runner.signals import RunStopped, signals_stop_the_run
from millstream.workers.prometheus import MULTIPROC_ENV

if TYPE_CHECKING:
    from millstream.processor import Processor
    from millstream.runner.publishers import PublisherProcesses

WorkerId = tuple[str, int, int]
"""(role, index, instance): ``instance`` > 0 only for deliberate duplicates."""


@dataclass
class _Slot:
    process: BaseProcess | None
    """None while the worker could not be started (its fork server died, say)."""
    errors: Connection | None
    deaths: list[float] = field(default_factory=list)
    """When the worker died, within the restart strategy's interval (monotonic seconds)."""
    died_at: float | None = None
    """When the runner saw it dead; None while it runs."""
    last_error: str = ""
    done: bool = False
    held: bool = False

    @property
    def exitcode(self) -> int | None:
        """The exit code; -1 for a worker that could not be started."""
        return -1 if self.process is None else self.process.exitcode

    def error(self) -> tuple[str, str] | None:
        """The error the dead worker reported, if it got to send one."""
        try:
            if self.errors is not None and self.errors.poll():
                kind, message = self.errors.recv()
                return str(kind), str(message)
        except (EOFError, OSError, ValueError, TypeError):
            pass  # killed mid-send, or nothing sent: a plain crash
        return None

    def close(self) -> None:
        # stop() may run in another thread than wait() (a benchmark, a notebook): both
        # close the pipes, and closing one twice is an error.
        errors, self.errors = self.errors, None
        if errors is not None:
            with contextlib.suppress(OSError):
                errors.close()


def _exit_text(code: int) -> str:
    if code == -1:
        return "could not be started"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class LocalRunner:
    """Runs every worker of a processor as a process and restarts the ones that die.

    Dead workers are restarted with backoff as ``processor.tuning.restart`` says; a worker
    in a crash loop, or one that failed in a way no restart cures, stops the run.

    Args:
        processor: What to run.
        progress: Print progress lines to ``out`` about once a second.
        instances: Extra live instances per worker (e.g. ``{("mapper", 0): 2}``) to
            exercise split brain; normally one each.
        out: Where progress goes.
        metrics_port: Serve Prometheus metrics of every worker and of the runner on this
            port (0: a free one, see ``metrics.port``) while the run lasts; None: none.
        metrics_host: The address the metrics endpoint listens on: loopback by default,
            ``"0.0.0.0"`` for every interface.
        hosts: The host each worker runs on, by ``(role, index)`` or, for one instance
            of a duplicate, ``(role, index, instance)``: a network namespace and its
            address (:class:`~millstream.runner.placement.WorkerHost`); workers not named
            run on this machine's loopback.
    """

    processor: Processor
    progress: bool = False
    instances: Mapping[tuple[str, int], int] = field(default_factory=dict)
    out: TextIO = sys.stderr
    metrics_port: int | None = None
    metrics_host: str = LOOPBACK
    hosts: Mapping[tuple[str, int] | WorkerId, WorkerHost] = field(default_factory=dict)
    label: bool = False
    """Name the processor in progress lines (when several run side by side)."""
    rescaling: bool = False
    """The run of a rescale (:func:`millstream.rescale`): it drains to the rescale's cut."""
    restarts: int = 0
    restarts_by_worker: dict[tuple[str, int], int] = field(default_factory=dict)
    metrics: MetricsServer | None = None
    """The metrics endpoint once started (with ``metrics_port``)."""
    publishers: PublisherProcesses | None = None
    """The publishers of the processor's Kafka sinks, once started."""
    _slots: dict[WorkerId, _Slot] = field(default_factory=dict)
    _ctx: WorkerContext = field(default_factory=lambda: worker_context())
    _stopped: threading.Event = field(default_factory=threading.Event)
    _started_at: float = 0.0
    _payload: bytes = b""
    _before: RunSummary | None = None

    def _spawn(self, wid: WorkerId) -> _Slot:
        """Start worker ``wid``; a slot with no process if it could not be started."""
        role, index, instance = wid
        reader, writer = self._ctx.Pipe(duplex=False)
        try:
            with main_module_hidden():
                parent = running_fork_server()
                process = self._ctx.Process(
                    target=child_main,
                    args=(
                        *(sys.path[:], self._environ(), self._payload, role, index, writer),
                        *(parent, self.hosts.get(wid) or self.hosts.get((role, index))),
                    ),
                    name=f"millstream-{role}-{index}" + (f"-{instance}" if instance else ""),
                    daemon=True,
                )
                process.start()
        except (OSError, EOFError, ValueError) as exc:
            # The fork server died (or was killed) under us: a worker that failed to
            # start, to be restarted with backoff like any dead worker. The next start
            # launches a new fork server.
            reader.close()
            writer.close()
            slot = _Slot(None, None, died_at=None)
            slot.last_error = f"could not start the worker process: {describe_error(exc)}"
            return slot
        writer.close()
        return _Slot(process, reader)

    def _environ(self) -> dict[str, str]:
        environ = dict(os.environ)
        if self.metrics is not None:
            environ.update(self.metrics.environ)
        return environ

    def start(self) -> None:
        """Check the store and start every worker (and the metrics endpoint, if asked).

        Raises:
            ConfigurationError: Called inside a worker process: the processor's module
                starts a run when it is imported; or ``Tuning.bind_host`` opens GetRows
                beyond loopback in plaintext (see
                :func:`~millstream.rpc.address.check_exposure`).
        """
        if os.environ.get(IN_WORKER_ENV):
            raise ConfigurationError(
                "a run was started inside a worker process: the module that defines the "
                "mapper and reducer starts the run when it is imported, and workers import "
                'it. Start the run under `if __name__ == "__main__":`, or run that file '
                "itself as the script (`python job.py`, `millstream run job.py:processor`)"
            )
        t = self.processor.tuning
        tls = tls_files(t) is not None
        check_exposure(mapper_address(t).bind, tls=tls, tuning=t, where="the local mappers")
        start_fork_server(self.processor)
        store = self.processor.open_store()
        try:
            prepare_store(store, self.processor.info, rescaling=self.rescaling)
            self._before = summarize(store, self.processor.info, 0, 0.0)
        finally:
            store.close()
        self._payload = dump_processor(self.processor)
        if self.metrics_port is not None and self.metrics is None:
            self.metrics = MetricsServer(
                self.metrics_port,
                lambda: dict(self.restarts_by_worker),
                directory=os.environ.get(MULTIPROC_ENV) or None,
                host=self.metrics_host,
            )
            if self.progress:
                print(f"millstream: metrics on {self.metrics.url}", file=self.out)
        self._started_at = time.monotonic()
        workers = [("mapper", m) for m in range(self.processor.num_mappers)] + [
            ("reducer", r) for r in range(self.processor.num_reducers)
        ]
        for role, index in workers:
            for instance in range(self.instances.get((role, index), 1)):
                wid = (role, index, instance)
                self._slots[wid] = self._spawn(wid)
        # Kafka's modules load here, in the runner only: the fork server and the workers
        # start without them.
        from millstream.runner.publishers import PublisherProcesses

        self.publishers = PublisherProcesses.of_outputs(self.processor.outputs, t.restart)
        self.publishers.start()

    def pids(self) -> dict[WorkerId, int]:
        """The live workers' process ids."""
        return {
            wid: slot.process.pid
            for wid, slot in self._slots.items()
            if not slot.done
            and not slot.held
            and slot.process is not None
            and slot.process.pid is not None
            and slot.process.is_alive()
        }

    def _slots_of(self, role: str, index: int) -> list[_Slot]:
        slots = [s for (r, i, _), s in self._slots.items() if (r, i) == (role, index)]
        if not slots:
            raise ValueError(f"no worker {role} {index} in this runner (was it started?)")
        return slots

    def hold(self, role: str, index: int) -> None:
        """Take a worker down (SIGKILL, as a crash would) and keep it down until
        :meth:`release`: the way to show that the others keep going without it."""
        for slot in self._slots_of(role, index):
            slot.held = True
            if slot.process is not None and slot.process.exitcode is None:
                slot.process.kill()
                slot.process.join()

    def release(self, role: str, index: int) -> None:
        """Let a held worker be started again by the next :meth:`poll`, at once."""
        for slot in self._slots_of(role, index):
            slot.held = False
            slot.deaths.clear()
            slot.died_at = -float("inf")

    def poll(self) -> bool:
        """Restart dead workers (and publishers of Kafka sinks); returns True once every
        worker has finished its work and every Kafka sink is published.

        Raises:
            UserCodeError, ConfigurationError, InputError, StoreCorruptError,
            StoreLimitError: A worker stopped on an error a restart cannot cure (its
                message); every worker is stopped first.
            CrashLoopError: A worker died more often than ``tuning.restart`` allows.
            MillstreamError: The runner was stopped.
        """
        if self._stopped.is_set():
            raise MillstreamError("the runner was stopped; start a new one to continue")
        strategy = self.processor.tuning.restart
        all_done = True
        for wid, slot in list(self._slots.items()):
            if slot.done:
                continue
            code = slot.exitcode
            if code is None:
                all_done = False
                continue
            if code == 0:
                slot.done = True
                continue
            all_done = False
            if slot.held:
                continue
            if code in (EXIT_USER_ERROR, EXIT_CONFIG_ERROR):
                reported = slot.error()
                self.stop()
                if reported is None:
                    raise MillstreamError(f"{wid[0]} {wid[1]} stopped with exit code {code}")
                kind, text = reported
                raise error_class(kind)(f"{wid[0]} {wid[1]} stopped: {text}")
            now = time.monotonic()
            if slot.died_at is None:
                self._record_death(wid, slot, code, now)
            assert slot.died_at is not None
            if now - slot.died_at < strategy.backoff(len(slot.deaths)):
                continue
            counted = slot.died_at > -float("inf")
            if self.progress and counted:
                print(
                    f"millstream: {wid[0]} {wid[1]} {_exit_text(code)}; restarting", file=self.out
                )
            slot.close()
            fresh = self._spawn(wid)
            fresh.deaths = slot.deaths
            fresh.last_error = fresh.last_error or slot.last_error
            self._slots[wid] = fresh
            if counted:
                self.restarts += 1
                key = (wid[0], wid[1])
                self.restarts_by_worker[key] = self.restarts_by_worker.get(key, 0) + 1
        published = self.publishers is None or self.publishers.poll()
        return all_done and published

    def _record_death(self, wid: WorkerId, slot: _Slot, code: int, now: float) -> None:
        """Count a death against the restart strategy; stop the run on a crash loop."""
        strategy = self.processor.tuning.restart
        reported = slot.error()
        if reported is not None:
            slot.last_error = f"{reported[1]}"
        elif code != -1:
            slot.last_error = ""
        slot.died_at = now
        slot.deaths = [t for t in slot.deaths if now - t < strategy.interval_seconds]
        slot.deaths.append(now)
        if len(slot.deaths) <= strategy.max_restarts:
            return
        self.stop()
        last = f"; its last error: {slot.last_error}" if slot.last_error else ""
        raise CrashLoopError(
            f"{wid[0]} {wid[1]} {_exit_text(code)}: it died {len(slot.deaths)} times within "
            f"{strategy.interval_seconds:g} s, more than the {strategy.max_restarts} restarts "
            f"the restart strategy allows{last}. Fix the cause and run again (a restart "
            "resumes from the last commit), or allow more restarts with "
            "Tuning(restart=RestartStrategy(max_restarts=..., interval_seconds=...))"
        )

    def wait(self, timeout: float | None = None) -> RunSummary:
        """Supervise until drained; returns the summary.

        SIGINT and SIGTERM (in the main thread) stop every worker, print the summary to
        ``out`` and raise :class:`RunStopped`.

        Raises:
            TimeoutError: Not drained within ``timeout`` seconds (workers are stopped).
            UserCodeError: A worker's ``map`` or ``reduce`` raised (workers are stopped).
            RunStopped: SIGINT or SIGTERM arrived (workers are stopped).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_report = time.monotonic()
        try:
            with signals_stop_the_run():
                while not self.poll():
                    now = time.monotonic()
                    if deadline is not None and now > deadline:
                        raise TimeoutError(f"processor did not drain within {timeout} s")
                    if self.progress and now - last_report >= 1.0:
                        last_report = now
                        self._report()
                    time.sleep(0.05)
        except KeyboardInterrupt as exc:
            self.stop()
            summary = self._summary(drained=False)
            print(f"millstream: {summary}", file=self.out)
            signum = exc.signum if isinstance(exc, RunStopped) else signal.SIGINT
            raise RunStopped(signum, summary) from None
        except BaseException:
            self.stop()
            raise
        return self.finish()

    def finish(self) -> RunSummary:
        """After :meth:`poll` returned True: release the run's resources; the summary."""
        summary = self._summary(drained=True)
        self._close_pipes()
        self._close_metrics()
        if self.progress:
            print(f"millstream: {self._label()}{summary}", file=self.out)
        return summary

    def _label(self) -> str:
        return f"[{self.processor.name}] " if self.label else ""

    def _summary(self, *, drained: bool) -> RunSummary:
        seconds = time.monotonic() - self._started_at
        store = self.processor.open_store()
        try:
            return summarize(
                store, self.processor.info, self.restarts, seconds, self._before, drained=drained
            )
        finally:
            store.close()

    def run(self, timeout: float | None = None) -> RunSummary:
        """Start, supervise until drained, and return the summary."""
        with signals_stop_the_run():
            self.start()
            return self.wait(timeout)

    def _report(self) -> None:
        store = self.processor.open_store()
        try:
            with store.read() as txn:
                status = read_status(
                    txn, self.processor.name, self.processor.tuning.heartbeat_seconds
                )
        finally:
            store.close()
        if status is None:
            return
        mappers, reducers = status["mappers"], status["reducers"]
        read = sum(m["rows_read"] for m in mappers)
        committed = sum(m["rows_persisted"] for m in mappers)
        window = sum(m["window_bytes"] for m in mappers)
        commits = sum(r["commits"] for r in reducers)
        elapsed = time.monotonic() - self._started_at
        print(
            f"millstream: {self._label()}{elapsed:6.1f} s  read {read:,} rows  "
            f"persisted {committed:,}  window {window / 1e6:.1f} MB  commits {commits:,}  "
            f"restarts {self.restarts}",
            file=self.out,
        )

    def stop(self, grace: float = 5.0) -> None:
        """Stop every worker: SIGTERM, then SIGKILL after ``grace`` seconds."""
        self._stopped.set()
        if self.publishers is not None:
            self.publishers.stop()
        live = [
            s.process
            for s in self._slots.values()
            if s.process is not None and s.process.exitcode is None
        ]
        for process in live:
            process.terminate()
        deadline = time.monotonic() + grace
        for process in live:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
        self._close_pipes()
        self._close_metrics()

    def _close_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def _close_pipes(self) -> None:
        for slot in self._slots.values():
            slot.close()


def run_local(
    processor: Processor,
    *,
    progress: bool = False,
    timeout: float | None = None,
    metrics_port: int | None = None,
    metrics_host: str = LOOPBACK,
) -> RunSummary:
    """Run every worker of ``processor`` as a process on this machine until bounded inputs
    drain; returns the run's summary.

    Crashed workers are restarted as ``processor.tuning.restart`` says. Ctrl-C or SIGTERM
    stops every worker, prints the summary to stderr and raises :class:`RunStopped`; a
    rerun resumes from the last commits. With ``metrics_port``, every worker's and the
    runner's Prometheus metrics are served at ``http://<host>:<metrics_port>/metrics``
    while the run lasts.

    Args:
        processor: What to run.
        progress: Print a progress line about once a second (to stderr).
        timeout: Stop every worker and raise :class:`TimeoutError` if the input has not
            drained after this many seconds.
        metrics_port: Serve Prometheus metrics on this port (0: any free one).
        metrics_host: The address the metrics listen on: loopback by default,
            ``"0.0.0.0"`` for every interface.
    """
    runner = LocalRunner(
        processor, progress=progress, metrics_port=metrics_port, metrics_host=metrics_host
    )
    return runner.run(timeout=timeout)


_MOVED = {
    "PipelineRunner": "millstream.runner.pipeline",
    "run_local_pipeline": "millstream.runner.pipeline",
}


def __getattr__(name: str) -> Any:
    """Deprecated paths of names that moved out of this module."""
    if name in _MOVED:
        import importlib

        warnings.warn(
            f"millstream.runner.local.{name} moved to {_MOVED[name]}.{name} "
            f"(or millstream.{name} where exported)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LocalRunner", "RunStopped", "WorkerId", "run_local"]
