"""The local runner: one OS process per worker on this machine, restarted when it dies."""

from __future__ import annotations

import contextlib
import cProfile
import os
import pickle
import pstats
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from millstream.exceptions import (
    FATAL_ERRORS,
    ConfigurationError,
    CrashLoopError,
    MillstreamError,
    UserCodeError,
)
from millstream.ledger import RunSummary, prepare_store, read_status, summarize
from millstream.rpc.address import LOOPBACK, check_exposure, mapper_address
from millstream.rpc.tls import tls_files
from millstream.runner.forkserver import (
    IN_WORKER_ENV,
    WorkerContext,
    die_with_parent,
    is_script,
    main_module_hidden,
    running_fork_server,
    start_fork_server,
    worker_context,
)
from millstream.runner.metrics import MetricsServer
from millstream.runner.placement import WorkerHost
from millstream.runner.publishers import PublisherProcesses
from millstream.workers import run_worker
from millstream.workers.prometheus import MULTIPROC_ENV

if TYPE_CHECKING:
    from millstream.processor import Processor

EXIT_USER_ERROR = 3
EXIT_CONFIG_ERROR = 4
"""Exit codes of a worker that stopped on an error a restart cannot cure (user code; any
other fatal error: configuration, input, store corruption or limits)."""

WorkerId = tuple[str, int, int]
"""(role, index, instance): ``instance`` > 0 only for deliberate duplicates."""


_MAX_MESSAGE = 16_000
"""Characters of an error message a child sends (well below a pipe's buffer)."""


def _child_main(
    path: list[str],
    environ: dict[str, str],
    payload: bytes,
    role: str,
    index: int,
    errors: Connection,
    parent: int | None,
    placement: WorkerHost | None = None,
) -> None:
    # Forked from the fork server: take this run's import path and environment before
    # unpickling the user's classes (the server's may be older).
    die_with_parent(parent)
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(environ)
    os.environ[IN_WORKER_ENV] = "1"

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        processor: Processor = pickle.loads(payload)
    except Exception as exc:
        # The user's module does not import here (or its classes moved): no restart helps.
        message = (
            f"could not load the processor's classes in the worker process: "
            f"{_describe(exc)}. Make the mapper's and reducer's module importable in a fresh "
            "process (no side effects that fail outside the launching program)"
        )
        errors.send(("ConfigurationError", message[:_MAX_MESSAGE]))
        errors.close()
        sys.exit(EXIT_CONFIG_ERROR)
    try:
        address = LOOPBACK
        if placement is not None:
            placement.enter()  # before any thread or socket: they belong to the host's network
            address = placement.address
        profile_dir = os.environ.get("MILLSTREAM_PROFILE_DIR")
        if profile_dir:
            _profiled(profile_dir, f"{role}-{index}-{os.getpid()}.prof")(
                processor, role, index, stop
            )
        else:
            run_worker(processor, role, index, stop, host=address)
    except FATAL_ERRORS as exc:
        # Each child has its own pipe: a worker killed while writing cannot wedge the
        # others (a shared queue's lock would stay held by the dead writer).
        errors.send((type(exc).__name__, str(exc)[:_MAX_MESSAGE]))
        errors.close()
        sys.exit(EXIT_USER_ERROR if isinstance(exc, UserCodeError) else EXIT_CONFIG_ERROR)
    except Exception as exc:
        # A crash a restart may cure (or not: the restart strategy decides); tell the
        # runner what it was, so that a crash loop ends naming it.
        errors.send((type(exc).__name__, _describe(exc)[:_MAX_MESSAGE]))
        errors.close()
        raise


def _describe(exc: BaseException) -> str:
    """``Type: message`` and where it was raised (the innermost frames)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


def dump_processor(processor: Processor) -> bytes:
    """Pickle ``processor`` for worker processes.

    Classes of scripts (``__main__``, files run by ``millstream run job.py:...``) travel
    by value: a worker never imports the script, whose top level may start the job itself.
    Classes of importable modules travel by reference, as plain pickle does.
    """
    import cloudpickle

    for cls in (processor.mapper, processor.reducer, type(processor.input)):
        module = sys.modules.get(cls.__module__)
        if module is not None and is_script(cls.__module__) and cls.__module__ != "__main__":
            cloudpickle.register_pickle_by_value(module)
    data: bytes = cloudpickle.dumps(processor, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def _profiled(directory: str, name: str) -> Callable[..., None]:
    """``run_worker`` under cProfile in every thread, merged stats in ``directory/name``.

    Set ``MILLSTREAM_PROFILE_DIR`` to profile every worker of a local run.
    """

    def run(*args: Any) -> None:
        profiles = [cProfile.Profile()]

        def in_new_thread(*_: Any) -> None:
            sys.setprofile(None)
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()

        threading.setprofile(in_new_thread)
        try:
            profiles[0].runcall(run_worker, *args)
        finally:
            threading.setprofile(None)
            stats = pstats.Stats(profiles[0])
            for profile in profiles[1:]:
                stats.add(profile)
            Path(directory).mkdir(parents=True, exist_ok=True)
            stats.dump_stats(str(Path(directory) / name))

    return run


def _error_class(name: str) -> type[MillstreamError]:
    for cls in FATAL_ERRORS:
        if cls.__name__ == name:
            return cls
    return MillstreamError


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


@dataclass
class _Slot:
    process: BaseProcess | None
    """None while the worker could not be started (its fork server died, say)."""
    errors: Connection | None
    deaths: list[float] = field(default_factory=list)
    """When the worker died, within the restart strategy's window (monotonic seconds)."""
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


@contextmanager
def _signals_stop_the_run() -> Iterator[None]:
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
                    target=_child_main,
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
            slot.last_error = f"could not start the worker process: {_describe(exc)}"
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
                raise _error_class(kind)(f"{wid[0]} {wid[1]} stopped: {text}")
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
        slot.deaths = [t for t in slot.deaths if now - t < strategy.window_seconds]
        slot.deaths.append(now)
        if len(slot.deaths) <= strategy.max_restarts:
            return
        self.stop()
        last = f"; its last error: {slot.last_error}" if slot.last_error else ""
        raise CrashLoopError(
            f"{wid[0]} {wid[1]} {_exit_text(code)}: it died {len(slot.deaths)} times within "
            f"{strategy.window_seconds:g} s, more than the {strategy.max_restarts} restarts "
            f"the restart strategy allows{last}. Fix the cause and run again (a restart "
            "resumes from the last commit), or allow more restarts with "
            "Tuning(restart=RestartStrategy(max_restarts=..., window_seconds=...))"
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
            with _signals_stop_the_run():
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
        with _signals_stop_the_run():
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
            with _signals_stop_the_run():
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
        with _signals_stop_the_run():
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
