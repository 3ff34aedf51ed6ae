"""The local runner: one OS process per worker on this machine, restarted when it dies."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, TextIO

from millstream.exceptions import ConfigurationError, MillstreamError, UserCodeError
from millstream.state import Store, Transaction, decode_int64
from millstream.state.records import check_processor_info, read_mapper_state, read_statuses
from millstream.workers import drained_key, reduced_key, run_worker

if TYPE_CHECKING:
    from millstream.processor import Processor

EXIT_USER_ERROR = 3
EXIT_CONFIG_ERROR = 4

WorkerId = tuple[str, int, int]
"""(role, index, instance): ``instance`` > 0 only for deliberate duplicates."""

# Large GetRows payloads are allocated and freed in bulk; keep glibc from handing that memory
# back to the kernel after every call (measured: 8x slower get_rows with the defaults).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


@dataclass(frozen=True)
class RunSummary:
    """What a drained run did.

    Attributes:
        rows_read: Input rows whose effects are committed (sum over mappers).
        rows_shuffled: Mapped rows (shuffle numbering, sum over mappers).
        rows_reduced: Rows committed by reducers in total (all runs of this processor).
        commits: Reducer transactions committed in total.
        restarts: Worker processes restarted after dying, in this run.
        seconds: Wall time of this run.
    """

    rows_read: int
    rows_shuffled: int
    rows_reduced: int
    commits: int
    restarts: int
    seconds: float

    def __str__(self) -> str:
        rate = self.rows_read / self.seconds if self.seconds > 0 else 0.0
        return (
            f"drained: {self.rows_read:,} rows read, {self.rows_shuffled:,} shuffled, "
            f"{self.rows_reduced:,} reduced in {self.commits:,} commits, "
            f"{self.restarts} restarts, {self.seconds:.2f} s ({rate:,.0f} rows/s)"
        )


def _child_main(
    processor: Processor, role: str, index: int, errors: mp.Queue[tuple[str, int, str]]
) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_worker(processor, role, index, stop)
    except UserCodeError as exc:
        errors.put((role, index, f"UserCodeError: {exc}"))
        errors.close()
        errors.join_thread()
        sys.exit(EXIT_USER_ERROR)
    except ConfigurationError as exc:
        errors.put((role, index, f"ConfigurationError: {exc}"))
        errors.close()
        errors.join_thread()
        sys.exit(EXIT_CONFIG_ERROR)


def prepare_store(processor: Processor, store: Store) -> None:
    """Checks and resets a runner does before starting workers.

    Refuses a store holding another processor's state, and clears the drained markers of
    an earlier run so that no reducer stops before this run's mappers have drained.
    """

    def prepare(txn: Transaction) -> None:
        check_processor_info(txn, processor.info)
        for m in range(processor.num_mappers):
            txn.clear(drained_key(m))

    store.transact(prepare)


def summarize(processor: Processor, store: Store, restarts: int, seconds: float) -> RunSummary:
    """Totals of a processor from its store."""
    txn = store.create_transaction()
    try:
        states = [read_mapper_state(txn, m) for m in range(processor.num_mappers)]

        def counter(r: int, what: str) -> int:
            raw = txn.get(reduced_key(r, what))
            return 0 if raw is None else decode_int64(raw)

        rows = sum(counter(r, "rows") for r in range(processor.num_reducers))
        commits = sum(counter(r, "commits") for r in range(processor.num_reducers))
    finally:
        txn.reset()
    return RunSummary(
        sum(s.input_unread_row_index for s in states),
        sum(s.shuffle_unread_row_index for s in states),
        rows,
        commits,
        restarts,
        seconds,
    )


@dataclass
class _Slot:
    process: BaseProcess
    started: float
    failures: int = 0
    done: bool = False


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
    _ctx: mp.context.SpawnContext = field(default_factory=lambda: mp.get_context("spawn"))
    _errors: mp.Queue[tuple[str, int, str]] | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)
    _started_at: float = 0.0

    def _spawn(self, wid: WorkerId) -> BaseProcess:
        assert self._errors is not None
        role, index, instance = wid
        process = self._ctx.Process(
            target=_child_main,
            args=(self.processor, role, index, self._errors),
            name=f"millstream-{role}-{index}" + (f"-{instance}" if instance else ""),
            daemon=True,
        )
        process.start()
        return process

    def start(self) -> None:
        """Check the store and start every worker."""
        store = self.processor.open_store()
        try:
            prepare_store(self.processor, store)
        finally:
            store.close()
        os.environ.update({k: v for k, v in MALLOC_ENV.items() if k not in os.environ})
        self._errors = self._ctx.Queue()
        self._started_at = time.monotonic()
        workers = [("mapper", m) for m in range(self.processor.num_mappers)] + [
            ("reducer", r) for r in range(self.processor.num_reducers)
        ]
        for role, index in workers:
            for instance in range(self.instances.get((role, index), 1)):
                wid = (role, index, instance)
                self._slots[wid] = _Slot(self._spawn(wid), time.monotonic())

    def pids(self) -> dict[WorkerId, int]:
        """The live workers' process ids."""
        return {
            wid: slot.process.pid
            for wid, slot in self._slots.items()
            if not slot.done and slot.process.pid is not None and slot.process.is_alive()
        }

    def _check_errors(self) -> None:
        assert self._errors is not None
        try:
            role, index, message = self._errors.get_nowait()
        except queue.Empty:
            return
        self.stop()
        kind, _, text = message.partition(": ")
        error = UserCodeError if kind == "UserCodeError" else ConfigurationError
        raise error(f"{role} {index} stopped: {text}")

    def poll(self) -> bool:
        """Restart dead workers; returns True once every worker has finished its work."""
        self._check_errors()
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
            if code in (EXIT_USER_ERROR, EXIT_CONFIG_ERROR):
                time.sleep(0.2)
                self._check_errors()
                raise MillstreamError(f"{wid[0]} {wid[1]} stopped with exit code {code}")
            all_done = False
            delay = min(5.0, 0.05 * 2 ** min(slot.failures, 7))
            if time.monotonic() - slot.started < delay:
                continue
            slot.failures += 1
            self.restarts += 1
            if self.progress:
                print(
                    f"millstream: {wid[0]} {wid[1]} died (exit {code}); restarting", file=self.out
                )
            slot.process = self._spawn(wid)
            slot.started = time.monotonic()
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
                if self._stopped.is_set():
                    raise MillstreamError("the run was stopped")
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
            summary = summarize(self.processor, store, self.restarts, seconds)
        finally:
            store.close()
        self._close_queue()
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
        self._close_queue()

    def _close_queue(self) -> None:
        if self._errors is not None:
            self._errors.close()
            self._errors.cancel_join_thread()
            self._errors = None
