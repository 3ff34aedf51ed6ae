"""Faults inside the SQLite backend: a statement seam, programs of store operations, and
the model they are checked against.

The seam is :class:`FaultyConnection`, the store's ``connection_factory``: every statement
the backend runs (each of a commit's, the run merges and folds, the wake-up reads) counts
as one step, and :class:`FaultPlan` fails step ``at`` with an I/O error, a full disk or a
lock timeout, or kills the process there. A step is also counted where a commit wakes
waiters (:meth:`FaultyStore._wake`), so a kill lands between a commit and its wake-ups.

A program is a list of operations on a few counters and a queue; :func:`run_program` runs
one against a store and a :class:`Model` (a dict of what committed, and the rows the
queue's producer appended) and checks the store against the model after every operation.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from millstream.exceptions import InputError, StoreError
from millstream.inputs import StoreQueue
from millstream.state.keys import add_int64s, encode_int64
from millstream.state.sqlite import SqliteStore

KEYS = 6
"""Counters ``("k", 0)`` to ``("k", KEYS - 1)``."""

FAULTS = {
    "io": ("disk I/O error", "SQLITE_IOERR"),
    "full": ("database or disk is full", "SQLITE_FULL"),
    "locked": ("database is locked", "SQLITE_BUSY"),
}
"""The errors a failed statement raises, by fault kind (``"kill"`` kills instead)."""


class FaultPlan:
    """Counts the backend's steps and fails step ``at`` (once) with fault ``kind``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps = 0
        self.at: int | None = None
        self.kind = "io"
        self.fired = False
        self.paused = False
        self.match = ""
        self.every = 0
        self.failed_ops = 0
        """Operations of :func:`run_op` the store failed, since the process started."""

    def arm(self, at: int | None, kind: str = "io", match: str = "", every: int = 0) -> None:
        """Count from zero the steps whose statement starts with ``match``; fail step
        ``at`` (None: count only), and every ``every`` steps after it if not 0."""
        with self._lock:
            self.steps, self.at, self.kind, self.fired = 0, at, kind, False
            self.match, self.every = match, every

    def step(self, what: str) -> None:
        """One step of the backend: ``what`` is the statement (or ``"wake"``)."""
        with self._lock:
            if self.paused or not what.startswith(self.match):
                return
            n = self.steps
            self.steps += 1
            if self.at is None or n < self.at:
                return
            if n != self.at and not (self.every and (n - self.at) % self.every == 0):
                return
            self.fired = True
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "wake":
            return  # waking swallows its own OS errors: only a kill matters here
        message, name = FAULTS[self.kind]
        exc = sqlite3.OperationalError(message)
        exc.sqlite_errorname = name
        raise exc


PLAN = FaultPlan()


class FaultyConnection(sqlite3.Connection):
    """A connection whose statements are steps of :data:`PLAN`."""

    plan: ClassVar[FaultPlan] = PLAN

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.plan.step(sql)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        self.plan.step(sql)
        return super().executemany(sql, parameters)


class FaultyStore(SqliteStore):
    """The SQLite store on :class:`FaultyConnection`, its wake-ups a step too."""

    def _wake(self, keys: set[bytes]) -> None:
        PLAN.step("wake")
        super()._wake(keys)


def open_faulty(path: Path) -> FaultyStore:
    """A store on ``path`` whose every ``add_many`` is a delta run."""
    return FaultyStore(
        f"sqlite:///{path}?run_min_keys=1",
        str(path),
        run_min_keys=1,
        busy_timeout_ms=200,
        connection_factory=FaultyConnection,
    )


# -- programs ---------------------------------------------------------------------------

Op = tuple[Any, ...]
"""``("txn", [writes])``, ``("append", n)`` (the producer appends sources up to ``n``),
``("wait", k)``. A write is ``("set", k, v)``, ``("add", k, d)``, ``("clear", k)``,
``("clear_range", a, b)``, ``("add_many", [(k, d), ...])`` or ``("lanes", [(k, d0, d1)])``."""


def random_program(rnd: random.Random, length: int) -> list[Op]:
    """A program of ``length`` operations."""
    program: list[Op] = []
    appended = 0

    def write() -> Op:
        kind = rnd.choice(["set", "add", "clear", "clear_range", "add_many", "add_many", "lanes"])
        k = rnd.randrange(KEYS)
        if kind == "set":
            return ("set", k, rnd.randrange(-5, 200))
        if kind == "add":
            return ("add", k, rnd.randrange(-5, 200))
        if kind == "clear":
            return ("clear", k)
        if kind == "clear_range":
            return ("clear_range", k, rnd.randrange(k, KEYS + 1))
        keys = rnd.sample(range(KEYS), rnd.randrange(1, KEYS + 1))
        if kind == "add_many":
            return ("add_many", [(key, rnd.randrange(-5, 200)) for key in keys])
        return ("lanes", [(key, rnd.randrange(50), rnd.randrange(50)) for key in keys])

    for _ in range(length):
        roll = rnd.random()
        if roll < 0.2:
            appended += 1
            program.append(("append", appended))
        elif roll < 0.27:
            program.append(("wait", rnd.randrange(KEYS)))
        else:
            program.append(("txn", [write() for _ in range(rnd.randrange(1, 4))]))
    return program


def source(sequence: int) -> pa.RecordBatch:
    """The rows of the producer's sequence ``sequence``: 3 to 4 pieces, ids unique."""
    rows = 25 + 7 * (sequence % 3)
    start = 1000 * sequence
    return pa.record_batch({"id": pa.array(range(start, start + rows), pa.int64())})


def all_ids(sequences: int) -> list[int]:
    """The ids of sources ``0`` to ``sequences - 1`` in order."""
    return [i for s in range(sequences) for i in source(s).column(0).to_pylist()]


@dataclass
class Model:
    """What committed: the counters' values, and how many sources the producer was told
    to append."""

    values: dict[int, bytes] = field(default_factory=dict)
    sources: int = 0

    def applied(self, writes: list[Op]) -> dict[int, bytes]:
        """The values after one transaction of ``writes``."""
        values = dict(self.values)
        for w in writes:
            if w[0] == "set":
                values[w[1]] = encode_int64(w[2])
            elif w[0] == "add":
                values[w[1]] = add_int64s(values.get(w[1]), encode_int64(w[2]))
            elif w[0] == "clear":
                values.pop(w[1], None)
            elif w[0] == "clear_range":
                for k in range(w[1], w[2]):
                    values.pop(k, None)
            elif w[0] == "add_many":
                for k, d in w[1]:
                    values[k] = add_int64s(values.get(k), encode_int64(d))
            else:
                for k, d0, d1 in w[1]:
                    values[k] = add_int64s(values.get(k), encode_int64(d0) + encode_int64(d1))
        return values


def write(txn: Any, writes: list[Op]) -> None:
    """Apply ``writes`` in ``txn``."""
    for w in writes:
        if w[0] == "set":
            txn.set(("k", w[1]), encode_int64(w[2]))
        elif w[0] == "add":
            txn.add(("k", w[1]), w[2])
        elif w[0] == "clear":
            txn.clear(("k", w[1]))
        elif w[0] == "clear_range":
            txn.clear_range(("k", w[1]), ("k", w[2]))
        elif w[0] == "add_many":
            txn.add_many(("k",), [k for k, _ in w[1]], [d for _, d in w[1]])
        else:
            deltas = pa.record_batch({"a": [d for _, d, _ in w[1]], "b": [d for _, _, d in w[1]]})
            txn.add_many(("k",), [k for k, _, _ in w[1]], deltas)


def stored_values(store: SqliteStore) -> dict[int, bytes]:
    """The counters as the store reads them, checked to agree across the three read
    paths (point, batch and range reads fold runs each their own way)."""
    with store.read() as txn:
        ranged = {int(key[-1]): v for key, v in txn.get_range(("k",), ("k", KEYS))}
        points = {k: txn.get(("k", k)) for k in range(KEYS)}
        many = txn.get_many(("k",), list(range(KEYS)))
    assert {k: v for k, v in points.items() if v is not None} == ranged
    assert {k: v for k, v in zip(range(KEYS), many, strict=True) if v is not None} == ranged
    return ranged


def queue_ids(queue: StoreQueue) -> list[int]:
    """Every row id the queue's partition holds, in order."""
    ids: list[int] = []
    while True:
        result = queue.read(0, len(ids), 10_000)
        if result.batch is None:
            return ids
        ids.extend(result.batch.column(0).to_pylist())


def produce(queue: StoreQueue, upto: int) -> None:
    """A producer (as one restarted) appends the sources up to ``upto`` from where it
    left off, the documented resume: ``last_sequence + 1``, each sequence its own rows."""
    producer = queue.producer("feed")
    for sequence in range(producer.last_sequence(0) + 1, upto):
        producer.append(0, source(sequence), sequence=sequence)


class Mismatch(AssertionError):
    """The store disagrees with the model."""


def check(
    store: SqliteStore, queue: StoreQueue, model: Model, where: str, rows: bool = True
) -> None:
    """The store holds what the model says committed, and (``rows``) the queue's rows are
    a prefix of the sources' (rows a reader saw never change, none is doubled or
    skipped)."""
    PLAN.paused = True
    try:
        got = stored_values(store)
        if got != model.values:
            raise Mismatch(f"{where}: counters {got}, model {model.values}")
        if not rows:
            return
        ids = queue_ids(queue)
        if ids != all_ids(model.sources)[: len(ids)]:
            raise Mismatch(f"{where}: queue rows are not a prefix of the sources': {ids}")
    finally:
        PLAN.paused = False


def run_op(store: SqliteStore, queue: StoreQueue, model: Model, op: Op) -> bool:
    """Run ``op``, update ``model`` with what committed; False if the store failed it."""
    try:
        if op[0] == "txn":
            after = model.applied(op[1])
            store.transact(lambda txn: write(txn, op[1]), max_retries=0)
            model.values = after
        elif op[0] == "append":
            model.sources = max(model.sources, op[1])
            produce(queue, op[1])
        else:
            store.wait_for(("k", op[1]), lambda raw: True, 0.0)
    except StoreError:
        PLAN.failed_ops += 1
        return False
    except InputError as exc:
        # An append whose store failed leaves nothing an InputError may name.
        raise Mismatch(f"{op}: {exc}") from exc
    finally:
        PLAN.paused = True
        try:
            store.merger.settle()  # a merge the commit asked for, on its thread: steps too
        finally:
            PLAN.paused = False
    return True


def run_program(
    path: Path,
    program: list[Op],
    at: int | None = None,
    kind: str = "io",
    every: int = 0,
    before_op: Callable[[int], None] = lambda n: None,
) -> int:
    """Run ``program`` on a new store at ``path``, step ``at`` (and every ``every`` steps
    after it) failing with ``kind``, checking the store against the model after every
    operation; then let the producer finish and check that every source landed once.
    ``before_op(n)`` runs before operation ``n`` (``len(program)``: before the finish).
    Returns the steps counted."""
    store = open_faulty(path)
    queue = StoreQueue(store, "q", 1)
    model = Model()
    PLAN.arm(at, kind, every=every)
    try:
        for n, op in enumerate(program):
            before_op(n)
            run_op(store, queue, model, op)
            where = f"after operation {n} {op} (fault {kind} at {at}, every {every})"
            check(store, queue, model, where, rows=op[0] == "append")
        steps = PLAN.steps
        PLAN.arm(None)
        before_op(len(program))
        produce(queue, model.sources)
        if queue_ids(queue) != all_ids(model.sources):
            raise Mismatch(f"fault {kind} at {at}: the producer's rows did not all land once")
        return steps
    finally:
        PLAN.arm(None)
        store.close()


def model_states(program: list[Op]) -> list[Model]:
    """The model before each operation of ``program`` and after the last, every
    operation committing."""
    states = [Model()]
    for op in program:
        last = states[-1]
        if op[0] == "txn":
            states.append(Model(last.applied(op[1]), last.sources))
        elif op[0] == "append":
            states.append(Model(last.values, max(last.sources, op[1])))
        else:
            states.append(last)
    return states


def reopened_check(path: Path, program: list[Op], at_op: int) -> None:
    """After a process running ``program`` on ``path`` died in operation ``at_op`` (or,
    with ``at_op == len(program)``, finished): a new store on the file holds the model
    before or after that operation, the queue's rows are a prefix of the sources', and
    the producer, resuming, lands every source once."""
    states = model_states(program)
    candidates = states[at_op : at_op + 2]
    store = open_faulty(path)
    queue = StoreQueue(store, "q", 1)
    try:
        got = stored_values(store)
        if all(got != state.values for state in candidates):
            raise Mismatch(
                f"died in operation {at_op}: counters {got}, model before "
                f"{candidates[0].values}, after {candidates[-1].values}"
            )
        sources = candidates[-1].sources
        ids = queue_ids(queue)
        if ids != all_ids(sources)[: len(ids)]:
            raise Mismatch(f"died in operation {at_op}: queue rows not a prefix: {ids}")
        produce(queue, sources)
        if queue_ids(queue) != all_ids(sources):
            raise Mismatch(f"died in operation {at_op}: the producer's rows did not land once")
    finally:
        store.close()
