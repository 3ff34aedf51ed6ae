"""A keyed sum fed by a store-backed queue at a fixed offered rate, with per-row latency.

Shared by :mod:`bench.latency` and :mod:`bench.recovery`. The pieces:

* **Producer** (:func:`producer_main`, a child process): appends rows to a
  :class:`millstream.inputs.StoreQueue` in the embedded SQLite store, in small batches on a
  fixed schedule (``rate`` rows/s, one append every ``tick_seconds``, partitions in turn).
  Rows are the :mod:`bench.workload` shape (int64 ``key`` uniform over 100,000 keys, int64
  ``value``, 64-character ``payload``) plus ``append_ns``: the wall clock (``time.time_ns``)
  taken just before the append transaction, the same for every row of one append. It keeps
  its own per-key sums of what it appended, for the exactness check.
* **Mapper** (:class:`TimedPreAggregate`): sums ``value`` per key within its batch (as
  ``examples/keyed_sum.py``) and, for the latency, adds one row per (reducer, append time)
  holding how many of the batch's input rows hash to that reducer and were appended then.
  Those rows go to the same reducer as the sums they describe, after them in the shuffle
  order, so they are committed in the same transaction as the last of those sums (never
  before any of them).
* **Reducer** (:class:`TimedSum`): folds the sums into ``("sum", key)`` counters with one
  batch ``add_many`` and a ``("rows", reducer)`` counter of input rows (both committed with
  the reducer's state, exactly once), remembers the append-time rows of the transaction,
  and in :meth:`~millstream.Reducer.on_commit` sends them with the commit time to the
  benchmark through a Unix datagram socket in the abstract namespace (no file, no disk
  write). The latency of a row is then ``commit time - append time``, exactly, per row.
* **Collector** (:class:`Collector`): receives those datagrams in the benchmark process.
* **Pipeline** (:class:`Pipeline`): a fresh store, the queue, the processor, the local
  runner (one process per worker), the producer, and the check that every appended row's
  effect is in the store exactly once.

The mapper also stamps ``mapped_ns`` (when it mapped the batch) on the append-time rows, a
diagnostic that splits latency into "append to map" and "map to commit". It is the one
non-deterministic value of ``map``; it never reaches the store, so a re-mapped batch (after
a restart) changes no effect.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
from millstream import _core
from millstream.inputs import StoreQueue
from millstream.ledger import read_statuses
from millstream.processor import Delivery
from millstream.runner.forkserver import start_fork_server
from millstream.runner.local import LocalRunner, RunSummary
from millstream.state import decode_int64

from bench.fresh_store import empty_store
from bench.queue_producer import (
    QUEUE_NAME,
    QUEUE_PREFIX,
    ProducerHandle,
    ProducerPlan,
    ProducerResult,
    serialize_sqlite_writers,
)

PROCESSOR_NAME = "queue_bench"

_MAGIC = 0x4D53_4C41_5431  # "MSLAT1"
_HEADER = 6
_COLUMNS = 4
_CHUNK = 1_500
"""Append-time rows per datagram (4 int64 each: 48 kB, below the socket's limit)."""


# --------------------------------------------------------------------------- the processor


class TimedPreAggregate(ms.Mapper):
    """Per-key sums of the batch, plus per (reducer, append time) input row counts.

    Output columns: ``key, value, append_ns, mapped_ns, rows``. A sum row has
    ``append_ns = 0``; an append-time row has ``key`` = this mapper's index, ``value = 0``,
    ``rows`` = input rows of that append routed to that reducer.
    """

    def __init__(self, spec: ms.WorkerSpec, config: Any) -> None:
        super().__init__(spec, config)
        if config.get("flock_writers"):
            serialize_sqlite_writers()

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        n = self.spec.num_reducers
        table = pa.Table.from_batches([batch]).select(["key", "value", "append_ns"])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        routed = ms.Partitioned.by_hash(sums, key="key", num_reducers=n)
        row_reducer = _core.hash_partition(batch, ["key"], n)
        per_append = (
            pa.table({"r": row_reducer, "append_ns": table["append_ns"]})
            .group_by(["r", "append_ns"], use_threads=False)
            .aggregate([([], "count_all")])
        )
        k, m = routed.batch.num_rows, per_append.num_rows
        now = time.time_ns()
        zeros_k = np.zeros(k, dtype=np.int64)
        zeros_m = np.zeros(m, dtype=np.int64)

        def col(data: Any) -> np.ndarray:
            return np.asarray(data.to_numpy() if hasattr(data, "to_numpy") else data, np.int64)

        out = pa.record_batch(
            [
                np.concatenate([col(routed.batch["key"]), np.full(m, self.spec.index, np.int64)]),
                np.concatenate([col(routed.batch["value_sum"]), zeros_m]),
                np.concatenate([zeros_k, col(per_append["append_ns"])]),
                np.concatenate([zeros_k, np.full(m, now, np.int64)]),
                np.concatenate([zeros_k, col(per_append["count_all"])]),
            ],
            names=["key", "value", "append_ns", "mapped_ns", "rows"],
        )
        indices = np.concatenate(
            [
                np.asarray(routed.reducer_indices.to_numpy(zero_copy_only=False), np.int32),
                np.asarray(per_append["r"].to_numpy(), np.int32),
            ]
        )
        return ms.Partitioned.with_indices(out, pa.array(indices, pa.int32()))


class TimedSum(ms.Reducer):
    """Adds the sums to ``("sum", key)`` and reports each commit's append times.

    ``config["collector"]``: the abstract Unix socket name of the :class:`Collector`.
    """

    def __init__(self, spec: ms.WorkerSpec, config: Any) -> None:
        super().__init__(spec, config)
        if config.get("flock_writers"):
            serialize_sqlite_writers()
        self._pending: tuple[int, int, np.ndarray] | None = None
        self._sock: socket.socket | None = None
        self._seq = 0

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        fetch_ns = time.time_ns()
        append = batch.column("append_ns").to_numpy()
        timing = append > 0
        sums = batch.filter(pa.array(~timing))
        if sums.num_rows:
            folded = (
                pa.Table.from_batches([sums])
                .group_by("key", use_threads=False)
                .aggregate([("value", "sum")])
            )
            txn.add_many(
                ("sum",), folded["key"].combine_chunks(), folded["value_sum"].combine_chunks()
            )
        marks = np.stack(
            [
                batch.column("key").to_numpy()[timing],
                append[timing],
                batch.column("mapped_ns").to_numpy()[timing],
                batch.column("rows").to_numpy()[timing],
            ],
            axis=1,
        ).astype(np.int64)
        rows = int(marks[:, 3].sum())
        if rows:
            txn.add(("rows", self.spec.index), rows)
        self._pending = (fetch_ns, rows, marks)

    def on_commit(self) -> None:
        commit_ns = time.time_ns()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        fetch_ns, _, marks = pending
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._seq += 1
        address = "\0" + str(self.config["collector"])
        for start in range(0, max(1, len(marks)), _CHUNK):
            chunk = marks[start : start + _CHUNK]
            header = np.array(
                [_MAGIC, self.spec.index, fetch_ns, commit_ns, len(chunk), self._seq], np.int64
            )
            self._sock.sendto(header.tobytes() + np.ascontiguousarray(chunk).tobytes(), address)

    def close(self) -> None:
        """Close the reporting socket (the worker process's exit does it otherwise)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# --------------------------------------------------------------------------- the collector


@dataclass
class Samples:
    """Everything the reducers reported, one entry per (commit, append) group of rows.

    Times are epoch seconds (float64; sub-microsecond resolution at today's epoch).
    """

    reducer: np.ndarray
    fetch: np.ndarray
    commit: np.ndarray
    mapper: np.ndarray
    append: np.ndarray
    mapped: np.ndarray
    rows: np.ndarray

    @property
    def latency(self) -> np.ndarray:
        """Commit minus append time, seconds."""
        return self.commit - self.append

    def select(self, mask: np.ndarray) -> Samples:
        """The samples where ``mask`` holds."""
        return Samples(**{k: v[mask] for k, v in vars(self).items()})

    @property
    def total_rows(self) -> int:
        """Input rows covered."""
        return int(self.rows.sum())

    def commits(self) -> dict[int, np.ndarray]:
        """Per reducer, its distinct commit times."""
        return {int(r): np.unique(self.commit[self.reducer == r]) for r in np.unique(self.reducer)}


class Collector:
    """Receives the reducers' commit reports on an abstract Unix datagram socket."""

    def __init__(self) -> None:
        self.address = f"millstream-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self._sock.bind("\0" + self.address)
        self._sock.settimeout(0.2)
        self._lock = threading.Lock()
        self._headers: list[np.ndarray] = []
        self._bodies: list[np.ndarray] = []
        self._rows = 0
        self.bad = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                return
            raw = np.frombuffer(data, np.int64)
            if raw.size < _HEADER or raw[0] != _MAGIC:
                self.bad += 1
                continue
            n = int(raw[4])
            body = raw[_HEADER : _HEADER + n * _COLUMNS].reshape(n, _COLUMNS)
            with self._lock:
                self._headers.append(np.repeat(raw[None, 1:4], n, axis=0))
                self._bodies.append(body)
                self._rows += int(body[:, 3].sum())

    @property
    def rows(self) -> int:
        """Input rows reported committed so far."""
        with self._lock:
            return self._rows

    def samples(self) -> Samples:
        """A copy of everything received so far."""
        with self._lock:
            headers = np.concatenate(self._headers) if self._headers else np.zeros((0, 3), "i8")
            bodies = np.concatenate(self._bodies) if self._bodies else np.zeros((0, 4), "i8")
            self._headers, self._bodies = [headers], [bodies]
        return Samples(
            reducer=headers[:, 0].copy(),
            fetch=headers[:, 1] / 1e9,
            commit=headers[:, 2] / 1e9,
            mapper=bodies[:, 0].copy(),
            append=bodies[:, 1] / 1e9,
            mapped=bodies[:, 2] / 1e9,
            rows=bodies[:, 3].copy(),
        )

    def close(self) -> None:
        """Stop receiving."""
        self._stop.set()
        self._thread.join()
        self._sock.close()


# --------------------------------------------------------------------------- the pipeline


def tuning_dict(tuning: ms.Tuning) -> dict[str, Any]:
    """The knobs as a plain dict."""
    return asdict(tuning)


@dataclass
class Pipeline:
    """A fresh store, queue and processor under ``run_dir``.

    Args:
        run_dir: Scratch directory (wiped); the SQLite store lives here, on disk.
        tuning: Worker knobs.
        num_mappers: Queue partitions (one mapper each).
        num_reducers: Reducers.
        keys: Key range of the producer.
        store_options: Query string of the SQLite store's URL (e.g. ``synchronous=normal``).
        store: Another store's URL (``fdb://<cluster file>``), emptied first; by default
            the SQLite store in ``run_dir``.
        flock_writers: Run the :func:`serialize_sqlite_writers` what-if experiment in
            every worker (the producer's plan has its own flag).
        delivery: The processor's delivery mode.
    """

    run_dir: Path
    tuning: ms.Tuning
    num_mappers: int = 2
    num_reducers: int = 2
    keys: int = 100_000
    store_options: str = ""
    store: str | None = None
    flock_writers: bool = False
    delivery: Delivery = "exactly_once"
    runner: LocalRunner | None = None
    started_at: float = 0.0
    _thread: threading.Thread | None = None
    _summary: RunSummary | None = None
    _error: BaseException | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.run_dir = self.run_dir.resolve()
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        if self.store is None:
            self.url = f"sqlite:///{self.run_dir / 'state.db'}" + (
                f"?{self.store_options}" if self.store_options else ""
            )
        else:
            empty_store(self.store)
            self.url = self.store
        self.queue = StoreQueue(self.url, QUEUE_NAME, self.num_mappers, prefix=QUEUE_PREFIX)
        self.collector = Collector()
        self.processor = ms.Processor(
            mapper=TimedPreAggregate,
            reducer=TimedSum,
            input=self.queue,
            store=self.url,
            num_reducers=self.num_reducers,
            name=PROCESSOR_NAME,
            config={"collector": self.collector.address, "flock_writers": self.flock_writers},
            tuning=self.tuning,
            delivery=self.delivery,
        )
        start_fork_server(self.processor)
        self._store = self.processor.open_store()

    def producer(self, plan: ProducerPlan) -> ProducerHandle:
        """Start a producer process (in the pipeline's what-if experiment, if any)."""
        if self.flock_writers:
            plan = replace(plan, flock_writers=True)
        return ProducerHandle(self.url, self.num_mappers, plan)

    def start(self, timeout: float | None = None) -> None:
        """Start every worker; a thread supervises them until they drain."""
        self.runner = LocalRunner(self.processor)
        self.started_at = time.time()
        self.runner.start()

        def supervise() -> None:
            assert self.runner is not None
            try:
                self._summary = self.runner.wait(timeout)
            except BaseException as exc:
                self._error = exc
            finally:
                self._done.set()

        self._thread = threading.Thread(target=supervise, name="supervisor", daemon=True)
        self._thread.start()

    def failed(self) -> BaseException | None:
        """The runner's error, if it stopped on one."""
        return self._error

    def wait(self, timeout: float) -> RunSummary:
        """Wait for the workers to drain (the producer must have sealed the queue)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the processor did not drain within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._summary is not None
        return self._summary

    def pids(self) -> dict[tuple[str, int], int]:
        """Live worker process ids by (role, index)."""
        assert self.runner is not None
        return {(role, index): pid for (role, index, _), pid in self.runner.pids().items()}

    def queue_ends(self) -> list[int]:
        """One past the last appended row, per partition."""
        return [self.queue.end_row_index(p) for p in range(self.num_mappers)]

    def statuses(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The workers' last published status records."""
        txn = self._store.create_transaction()
        try:
            return read_statuses(txn)
        finally:
            txn.reset()

    def read_results(self) -> tuple[np.ndarray, dict[int, int]]:
        """The committed per-key sums (dense array over the key range) and row counters."""
        txn = self._store.create_transaction()
        try:
            view = ms.Transaction(txn)
            # The counters first: on a loaded host the long range read of the sums may take
            # the transaction past its age limit, which the next read would then raise.
            rows = {r: view.get_int(("rows", r)) for r in range(self.num_reducers)}
            sums, extra = read_key_sums(view, self.keys)
        finally:
            txn.reset()
        if extra:
            rows[-1] = extra
        return sums, rows

    def verify(self, produced: ProducerResult) -> dict[str, Any]:
        """Every appended row's effect exactly once: per-key sums and row counts."""
        sums, rows = self.read_results()
        samples = self.collector.samples()
        mismatched = int((sums != produced.sums).sum())
        committed_rows = sum(v for r, v in rows.items() if r >= 0)
        ok = mismatched == 0 and committed_rows == produced.rows and rows.get(-1, 0) == 0
        return {
            "ok": ok,
            "keys_checked": self.keys,
            "keys_mismatched": mismatched,
            "unexpected_keys": rows.get(-1, 0),
            "rows_appended": produced.rows,
            "rows_committed": committed_rows,
            "rows_reported_on_commit": samples.total_rows,
            "summary": (
                f"{'OK' if ok else 'MISMATCH'}: {self.keys - mismatched:,}/{self.keys:,} key sums "
                f"equal the producer's, {committed_rows:,} rows committed of "
                f"{produced.rows:,} appended, {samples.total_rows:,} reported by on_commit"
            ),
        }

    def close(self, keep: bool = False) -> None:
        """Stop everything and remove the store unless ``keep``."""
        if self.runner is not None and not self._done.is_set():
            self.runner.stop()
        if self._thread is not None:
            self._thread.join(30)
        self.collector.close()
        self._store.close()
        self.queue.close()
        if not keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def read_key_sums(view: ms.Transaction, keys: int) -> tuple[np.ndarray, int]:
    """The committed ``("sum", key)`` counters as a dense array over ``[0, keys)``, and how
    many keys outside that range were found (none, in an exact run)."""
    sums = np.zeros(keys, np.int64)
    extra = 0
    for key, raw in view.get_range(("sum",)):
        k = int(key[-1])
        if 0 <= k < keys:
            sums[k] = decode_int64(raw)
        else:
            extra += 1
    return sums, extra


def loadavg() -> str:
    """``/proc/loadavg``."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    """Progress output, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


Monitor = Callable[[float], None]


class PeriodicSampler(ABC):
    """Calls :meth:`sample` every ``period`` seconds in a thread and keeps the rows it
    returns; a sample the store is too busy for is skipped (and said). Subclasses say what
    a sample is (the straggler and recovery benchmarks)."""

    def __init__(self, pipeline: Pipeline, period: float) -> None:
        self.pipeline = pipeline
        self.period = period
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    @abstractmethod
    def sample(self) -> dict[str, Any]:
        """One row of figures (raise to skip it)."""

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                row = self.sample()
            except Exception as exc:  # a busy store: skip this sample
                log(f"  sample skipped: {exc}")
                continue
            self.rows.append(row)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join()
