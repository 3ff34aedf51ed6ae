"""The producer of the queue benchmarks: appends the workload's rows to the store-backed
queue at offered rates (steps), stamping each row with its append time, from a process of
its own; and the what-if experiment that queues SQLite writers on an flock."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pyarrow as pa
from millstream.inputs import StoreQueue

SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("value", pa.int64()),
        ("payload", pa.string()),
        ("append_ns", pa.int64()),
    ]
)
ROW_BYTES = 8 + 8 + 64 + 4 + 8
"""Arrow bytes of one input row (the 84-byte workload row plus the 8-byte timestamp)."""

QUEUE_PREFIX = ("input",)
QUEUE_NAME = "events"

# --------------------------------------------------------------------------- what-if


_FLOCK_PATCHED = False


def serialize_sqlite_writers() -> None:
    """What-if experiment, not millstream's behaviour: queue this process's SQLite commits
    on an ``flock`` of ``<store>.writer-lock`` (and a thread lock) before ``BEGIN
    IMMEDIATE``, so that writers of every process wake as soon as the previous one commits
    instead of sleeping in SQLite's busy handler (1, 2, 5, 10, 15, 20, 25, ... 100 ms steps).

    Patches the store's private commit method in this process only; SQLite's own locking
    is unchanged (the flock is an extra, advisory queue in front of it), so correctness
    does not depend on every writer taking it.
    """
    global _FLOCK_PATCHED
    if _FLOCK_PATCHED:
        return
    import fcntl

    from millstream.state import sqlite as sqlite_store

    original = sqlite_store.SqliteTransaction._raw_commit
    files: dict[str, int] = {}
    local = threading.Lock()

    def _raw_commit(self: Any) -> None:
        if not self._log:
            return original(self)
        path = self._sqlite.path + ".writer-lock"
        with local:
            fd = files.get(path)
            if fd is None:
                fd = files[path] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                return original(self)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    sqlite_store.SqliteTransaction._raw_commit = _raw_commit  # type: ignore[method-assign]
    _FLOCK_PATCHED = True


# --------------------------------------------------------------------------- the producer


@dataclass(frozen=True)
class Step:
    """Offer ``rate`` rows/s for ``seconds``."""

    seconds: float
    rate: float


@dataclass(frozen=True)
class ProducerPlan:
    """What the producer does.

    Args:
        steps: Offered rates in order (a fixed rate is one step; a ramp several).
        tick_seconds: Time between appends (partitions take turns), so each append holds
            ``rate * tick_seconds`` rows.
        keys: Keys are uniform over ``[0, keys)``.
        seed: Seed of the generator.
        prefill_rows: Rows appended as fast as possible before the steps (to drain a
            backlog), in batches of ``prefill_batch_rows``.
        seal: Seal every partition at the end, so the processor drains and exits.
        flock_writers: The :func:`serialize_sqlite_writers` what-if experiment.
        spread: Every tick appends to every partition (``rate * tick_seconds /
            partitions`` rows each, one append per partition), as a producer routing rows
            to partitions by key does; default: one partition per tick, in turn.
    """

    steps: tuple[Step, ...]
    tick_seconds: float = 0.01
    keys: int = 100_000
    seed: int = 11
    prefill_rows: int = 0
    prefill_batch_rows: int = 50_000
    seal: bool = True
    flock_writers: bool = False
    spread: bool = False


def _payload_pool(rng: np.random.Generator, rows: int) -> pa.StringArray:
    alphabet = np.frombuffer(
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-", np.uint8
    )
    chars = alphabet[rng.integers(0, 64, rows * 64, dtype=np.uint8)]
    offsets = np.arange(0, (rows + 1) * 64, 64, dtype=np.int32)
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(chars))


class _Appender:
    def __init__(self, queue: StoreQueue, plan: ProducerPlan) -> None:
        self.queue = queue
        self.plan = plan
        self.rng = np.random.default_rng(plan.seed)
        self.pool = _payload_pool(self.rng, 1 << 17)
        self.sums = np.zeros(plan.keys, np.int64)
        self.counts = np.zeros(plan.keys, np.int64)
        self.rows = 0
        self.appends = 0
        self.offset = 0

    def append(self, partition: int, n: int) -> tuple[int, float]:
        """Append ``n`` rows; returns (append_ns stamped, seconds the append took)."""
        keys = self.rng.integers(0, self.plan.keys, n, dtype=np.int64)
        values = self.rng.integers(0, 1_000_000, n, dtype=np.int64)
        if self.offset + n > len(self.pool):
            self.offset = 0
        payload = self.pool.slice(self.offset, n)
        self.offset += n
        stamp = time.time_ns()
        batch = pa.record_batch(
            [pa.array(keys), pa.array(values), payload, pa.array(np.full(n, stamp, np.int64))],
            schema=SCHEMA,
        )
        start = time.perf_counter()
        self.queue.append(partition, batch)
        took = time.perf_counter() - start
        np.add.at(self.sums, keys, values)
        np.add.at(self.counts, keys, 1)
        self.rows += n
        self.appends += 1
        return stamp, took


def _quantiles_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values) * 1000
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "max_ms": float(a.max()),
    }


def producer_main(
    url: str, partitions: int, plan: ProducerPlan, out: Connection, stop: Any
) -> None:
    """The producer process: prefill, the steps, seal; sends its record through ``out``."""
    if plan.flock_writers:
        serialize_sqlite_writers()
    queue = StoreQueue(url, QUEUE_NAME, partitions, prefix=QUEUE_PREFIX)
    app = _Appender(queue, plan)
    record: dict[str, Any] = {"steps": [], "prefill": None}
    tick = 0
    if plan.prefill_rows:
        start = time.time()
        left = plan.prefill_rows
        while left > 0:
            n = min(plan.prefill_batch_rows, left)
            app.append(tick % partitions, n)
            tick += 1
            left -= n
        record["prefill"] = {"rows": plan.prefill_rows, "seconds": time.time() - start}
        out.send(("prefilled", time.time()))
    for index, step in enumerate(plan.steps):
        if stop.is_set():
            break
        batch_rows = max(1, round(step.rate * plan.tick_seconds))
        interval = batch_rows / step.rate
        t0 = time.monotonic()
        start_ns = time.time_ns()
        end = t0 + step.seconds
        due = t0
        rows0, appends0 = app.rows, app.appends
        behind: list[float] = []
        took: list[float] = []
        # A step ends on the clock: a producer that cannot keep up appends back to back
        # until then (its achieved rate shows it), it does not stretch the step.
        while due < end and not stop.is_set():
            now = time.monotonic()
            if now >= end:
                break
            if due > now:
                time.sleep(due - now)
            behind.append(max(0.0, time.monotonic() - due))
            if plan.spread:
                share, extra = divmod(batch_rows, partitions)
                sizes = [share + (p < extra) for p in range(partitions)]
                seconds = sum(app.append(p, n)[1] for p, n in enumerate(sizes) if n)
            else:
                _, seconds = app.append(tick % partitions, batch_rows)
            took.append(seconds)
            tick += 1
            due += interval
        end_ns = time.time_ns()
        elapsed = (end_ns - start_ns) / 1e9
        record["steps"].append(
            {
                "index": index,
                "rate": step.rate,
                "seconds": step.seconds,
                "batch_rows": batch_rows,
                "interval_s": interval,
                "start": start_ns / 1e9,
                "end": end_ns / 1e9,
                "rows": app.rows - rows0,
                "appends": app.appends - appends0,
                "achieved_rate": (app.rows - rows0) / elapsed if elapsed > 0 else 0.0,
                "behind": _quantiles_ms(behind),
                "append": _quantiles_ms(took),
                "stopped_early": stop.is_set(),
            }
        )
        out.send(("step", record["steps"][-1]))
    ends = []
    if plan.seal:
        ends = [queue.close_partition(p) for p in range(partitions)]
    record.update(
        {
            "rows": app.rows,
            "appends": app.appends,
            "ends": ends,
            "sums": app.sums.tobytes(),
            "counts": app.counts.tobytes(),
        }
    )
    out.send(("done", record))
    queue.close()


@dataclass
class ProducerResult:
    """The producer's record: rows and per-key sums it appended, and its step figures."""

    rows: int
    appends: int
    sums: np.ndarray
    counts: np.ndarray
    steps: list[dict[str, Any]]
    prefill: dict[str, Any] | None
    ends: list[int]


class ProducerHandle:
    """A running producer process."""

    def __init__(self, url: str, partitions: int, plan: ProducerPlan) -> None:
        ctx = mp.get_context("forkserver")
        self._recv, send = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self.process = ctx.Process(
            target=producer_main,
            args=(url, partitions, plan, send, self._stop),
            name="bench-producer",
            daemon=True,
        )
        self.process.start()
        send.close()
        self.steps: list[dict[str, Any]] = []
        self.prefilled_at: float | None = None
        self._result: ProducerResult | None = None

    def poll(self, timeout: float = 0.0) -> ProducerResult | None:
        """Take the messages that arrived; the result once the producer is done."""
        while self._result is None and self._recv.poll(timeout):
            kind, payload = self._recv.recv()
            if kind == "step":
                self.steps.append(payload)
            elif kind == "prefilled":
                self.prefilled_at = payload
            elif kind == "done":
                self._result = ProducerResult(
                    rows=payload["rows"],
                    appends=payload["appends"],
                    sums=np.frombuffer(payload["sums"], np.int64),
                    counts=np.frombuffer(payload["counts"], np.int64),
                    steps=payload["steps"],
                    prefill=payload["prefill"],
                    ends=payload["ends"],
                )
            timeout = 0.0
        if self._result is None and not self.process.is_alive() and not self._recv.poll():
            raise RuntimeError(f"the producer died (exit code {self.process.exitcode})")
        return self._result

    def stop(self) -> None:
        """Ask the producer to end its current step now (it still seals)."""
        self._stop.set()

    def result(self, timeout: float = 600.0) -> ProducerResult:
        """Wait for the producer to finish."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.poll(0.2)
            if result is not None:
                self.process.join(10)
                return result
            if time.monotonic() > deadline:
                self.process.kill()
                raise TimeoutError("the producer did not finish")
