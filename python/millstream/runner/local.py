"""The local runner: one OS process per worker on this machine, restarted when it dies."""

from __future__ import annotations

import cProfile
import os
import pickle
import pstats
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from millstream.exceptions import (
    ConfigurationError,
    InputError,
    MillstreamError,
    StoreCorruptError,
    StoreLimitError,
    UserCodeError,
)
from millstream.runner.forkserver import (
    WorkerContext,
    start_fork_server,
    worker_context,
)
from millstream.state import Store, Transaction, decode_int64
from millstream.state.records import check_processor_info, read_mapper_state, read_statuses
from millstream.workers import drained_key, mapped_key, reduced_key, run_worker

if TYPE_CHECKING:
    from millstream.processor import Processor

EXIT_USER_ERROR = 3
EXIT_CONFIG_ERROR = 4
"""Exit codes of a worker that stopped on an error a restart cannot cure (user code; any
other fatal error: configuration, input, store corruption or limits)."""

WorkerId = tuple[str, int, int]
"""(role, index, instance): ``instance`` > 0 only for deliberate duplicates."""


@dataclass(frozen=True)
class RunSummary:
    """What a drained run did.

    The counts are the processor's totals over all its runs (its store keeps them); the
    rates in ``str()`` are this run's: rows and bytes since it started over its wall time.

    Attributes:
        rows_read: Input rows whose effects are committed (sum over mappers).
        rows_shuffled: Mapped rows (shuffle numbering, sum over mappers).
        rows_reduced: Rows committed by reducers in total (all runs of this processor).
        commits: Reducer transactions committed in total.
        restarts: Worker processes restarted after dying, in this run.
        seconds: Wall time of this run.
        batches: Mapped batches whose effects were persisted (all runs; replays after a
            restart count again).
        bytes_shuffled: Arrow IPC bytes reducers fetched and committed (all runs).
        rows_read_before: ``rows_read`` when this run started (earlier runs' rows).
        bytes_shuffled_before: ``bytes_shuffled`` when this run started.
    """

    rows_read: int
    rows_shuffled: int
    rows_reduced: int
    commits: int
    restarts: int
    seconds: float
    batches: int = 0
    bytes_shuffled: int = 0
    rows_read_before: int = 0
    bytes_shuffled_before: int = 0

    def __str__(self) -> str:
        seconds = max(self.seconds, 1e-9)
        rows = self.rows_read - self.rows_read_before
        shuffled = self.bytes_shuffled - self.bytes_shuffled_before
        this_run = f" ({rows:,} in this run)" if self.rows_read_before else ""
        return (
            f"drained: {self.rows_read:,} rows read{this_run} in {self.batches:,} batches, "
            f"{self.rows_shuffled:,} shuffled ({self.bytes_shuffled / 1e6:,.1f} MB), "
            f"{self.rows_reduced:,} reduced in {self.commits:,} commits, "
            f"{self.restarts} restarts, {self.seconds:.2f} s "
            f"({rows / seconds:,.0f} rows/s, {shuffled / seconds / 1e6:,.1f} MB/s shuffled)"
        )


FATAL_ERRORS: tuple[type[MillstreamError], ...] = (
    UserCodeError,
    ConfigurationError,
    InputError,
    StoreCorruptError,
    StoreLimitError,
)
"""Errors a restart cannot cure: the worker reports them and the run stops."""

_MAX_MESSAGE = 16_000
"""Characters of an error message a child sends (well below a pipe's buffer)."""


def _child_main(
    path: list[str],
    environ: dict[str, str],
    payload: bytes,
    role: str,
    index: int,
    errors: Connection,
) -> None:
    # Forked from the fork server: take this run's import path and environment before
    # unpickling the user's classes (the server's may be older).
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(environ)
    processor: Processor = pickle.loads(payload)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        profile_dir = os.environ.get("MILLSTREAM_PROFILE_DIR")
        if profile_dir:
            _profiled(profile_dir, f"{role}-{index}-{os.getpid()}.prof")(
                processor, role, index, stop
            )
        else:
            run_worker(processor, role, index, stop)
    except FATAL_ERRORS as exc:
        # Each child has its own pipe: a worker killed while writing cannot wedge the
        # others (a shared queue's lock would stay held by the dead writer).
        errors.send((type(exc).__name__, str(exc)[:_MAX_MESSAGE]))
        errors.close()
        sys.exit(EXIT_USER_ERROR if isinstance(exc, UserCodeError) else EXIT_CONFIG_ERROR)


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


def prepare_store(processor: Processor, store: Store) -> None:
    """Checks and resets a runner does before starting workers.

    Refuses a store holding another processor's state, and clears the drained markers of
    an earlier run so that no reducer stops before this run's mappers have drained.
    """

    def prepare(txn: Transaction) -> None:
        check_processor_info(txn, processor.info)
        for m in range(processor.num_mappers):
            txn.clear(drained_key(m))

    # Idempotent: it checks the processor's record and clears markers.
    store.transact(prepare, idempotent=True)


def summarize(
    processor: Processor,
    store: Store,
    restarts: int,
    seconds: float,
    before: RunSummary | None = None,
) -> RunSummary:
    """Totals of a processor from its store; ``before``: the totals when the run started."""
    txn = store.create_transaction()
    try:
        states = [read_mapper_state(txn, m) for m in range(processor.num_mappers)]

        def counter(key: tuple[str, str, int, str]) -> int:
            raw = txn.get(key)
            return 0 if raw is None else decode_int64(raw)

        reducers = range(processor.num_reducers)
        rows = sum(counter(reduced_key(r, "rows")) for r in reducers)
        commits = sum(counter(reduced_key(r, "commits")) for r in reducers)
        shuffled = sum(counter(reduced_key(r, "bytes")) for r in reducers)
        batches = sum(counter(mapped_key(m, "batches")) for m in range(processor.num_mappers))
    finally:
        txn.reset()
    return RunSummary(
        sum(s.input_unread_row_index for s in states),
        sum(s.shuffle_unread_row_index for s in states),
        rows,
        commits,
        restarts,
        seconds,
        batches,
        shuffled,
        before.rows_read if before is not None else 0,
        before.bytes_shuffled if before is not None else 0,
    )


@dataclass
class _Slot:
    process: BaseProcess
    errors: Connection
    started: float
    failures: int = 0
    done: bool = False
    held: bool = False

    def error(self) -> tuple[str, str] | None:
        """The fatal error the dead worker reported, if it got to send one."""
        try:
            if self.errors.poll():
                kind, message = self.errors.recv()
                return str(kind), str(message)
        except (EOFError, OSError, ValueError, TypeError):
            pass  # killed mid-send, or nothing sent: a plain crash
        return None


@dataclass
class LocalRunner:
    """Runs every worker of a processor as a process and restarts the ones that die.

    Args:
        processor: What to run.
        progress: Print progress lines to ``out`` about once a second.
        instances: Extra live instances per worker (e.g. ``{("mapper", 0): 2}``) to
            exercise split brain; normally one each.
        out: Where progress goes.
    """

    processor: Processor
    progress: bool = False
    instances: Mapping[tuple[str, int], int] = field(default_factory=dict)
    out: TextIO = sys.stderr
    restarts: int = 0
    _slots: dict[WorkerId, _Slot] = field(default_factory=dict)
    _ctx: WorkerContext = field(default_factory=lambda: worker_context())
    _stopped: threading.Event = field(default_factory=threading.Event)
    _started_at: float = 0.0
    _payload: bytes = b""
    _before: RunSummary | None = None

    def _spawn(self, wid: WorkerId) -> tuple[BaseProcess, Connection]:
        role, index, instance = wid
        reader, writer = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_child_main,
            args=(list(sys.path), dict(os.environ), self._payload, role, index, writer),
            name=f"millstream-{role}-{index}" + (f"-{instance}" if instance else ""),
            daemon=True,
        )
        process.start()
        writer.close()
        return process, reader

    def _respawn(self, wid: WorkerId, slot: _Slot) -> None:
        slot.errors.close()
        slot.process, slot.errors = self._spawn(wid)
        slot.started = time.monotonic()

    def start(self) -> None:
        """Check the store and start every worker."""
        start_fork_server(self.processor)
        store = self.processor.open_store()
        try:
            prepare_store(self.processor, store)
            self._before = summarize(self.processor, store, 0, 0.0)
        finally:
            store.close()
        self._payload = pickle.dumps(self.processor)
        self._started_at = time.monotonic()
        workers = [("mapper", m) for m in range(self.processor.num_mappers)] + [
            ("reducer", r) for r in range(self.processor.num_reducers)
        ]
        for role, index in workers:
            for instance in range(self.instances.get((role, index), 1)):
                wid = (role, index, instance)
                process, errors = self._spawn(wid)
                self._slots[wid] = _Slot(process, errors, time.monotonic())

    def pids(self) -> dict[WorkerId, int]:
        """The live workers' process ids."""
        return {
            wid: slot.process.pid
            for wid, slot in self._slots.items()
            if not slot.done
            and not slot.held
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
            if slot.process.exitcode is None:
                slot.process.kill()
                slot.process.join()

    def release(self, role: str, index: int) -> None:
        """Let a held worker be started again by the next :meth:`poll`."""
        for slot in self._slots_of(role, index):
            slot.held = False
            slot.failures = 0
            slot.started = 0.0

    def poll(self) -> bool:
        """Restart dead workers; returns True once every worker has finished its work.

        Raises:
            UserCodeError, ConfigurationError, InputError, StoreCorruptError,
            StoreLimitError: A worker stopped on an error a restart cannot cure (its
                message); every worker is stopped first.
            MillstreamError: The runner was stopped.
        """
        if self._stopped.is_set():
            raise MillstreamError("the runner was stopped; start a new one to continue")
        all_done = True
        for wid, slot in self._slots.items():
            if slot.done:
                continue
            code = slot.process.exitcode
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
            delay = min(5.0, 0.05 * 2 ** min(slot.failures, 7))
            if time.monotonic() - slot.started < delay:
                continue
            slot.failures += 1
            if slot.started > 0.0:
                self.restarts += 1
            if self.progress:
                print(
                    f"millstream: {wid[0]} {wid[1]} died (exit {code}); restarting", file=self.out
                )
            self._respawn(wid, slot)
        return all_done

    def wait(self, timeout: float | None = None) -> RunSummary:
        """Supervise until drained; returns the summary.

        Raises:
            TimeoutError: Not drained within ``timeout`` seconds (workers are stopped).
            UserCodeError: A worker's ``map`` or ``reduce`` raised (workers are stopped).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_report = time.monotonic()
        try:
            while not self.poll():
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise TimeoutError(f"processor did not drain within {timeout} s")
                if self.progress and now - last_report >= 1.0:
                    last_report = now
                    self._report()
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        seconds = time.monotonic() - self._started_at
        store = self.processor.open_store()
        try:
            summary = summarize(self.processor, store, self.restarts, seconds, self._before)
        finally:
            store.close()
        self._close_pipes()
        if self.progress:
            print(f"millstream: {summary}", file=self.out)
        return summary

    def run(self, timeout: float | None = None) -> RunSummary:
        """Start, supervise until drained, and return the summary."""
        self.start()
        return self.wait(timeout)

    def _report(self) -> None:
        store = self.processor.open_store()
        try:
            txn = store.create_transaction()
            try:
                statuses = read_statuses(txn)
            finally:
                txn.reset()
        finally:
            store.close()
        read = sum(
            int(v.get("rows_read", 0)) for (role, _), v in statuses.items() if role == "mapper"
        )
        committed = sum(
            int(v.get("persisted_input_unread_row_index", 0))
            for (role, _), v in statuses.items()
            if role == "mapper"
        )
        window = sum(
            int(v.get("window_bytes", 0)) for (role, _), v in statuses.items() if role == "mapper"
        )
        commits = sum(
            int(v.get("commits", 0)) for (role, _), v in statuses.items() if role == "reducer"
        )
        elapsed = time.monotonic() - self._started_at
        print(
            f"millstream: {elapsed:6.1f} s  read {read:,} rows  persisted {committed:,}  "
            f"window {window / 1e6:.1f} MB  commits {commits:,}  restarts {self.restarts}",
            file=self.out,
        )

    def stop(self, grace: float = 5.0) -> None:
        """Stop every worker: SIGTERM, then SIGKILL after ``grace`` seconds."""
        self._stopped.set()
        live = [s.process for s in self._slots.values() if s.process.exitcode is None]
        for process in live:
            process.terminate()
        deadline = time.monotonic() + grace
        for process in live:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for slot in self._slots.values():
            slot.errors.close()
