"""A deterministic, in-process simulation of the whole shuffle protocol (thesis 4.3-4.6).

The REAL worker classes run here (:class:`MapperWorker`, :class:`ReducerWorker`), stepped
one protocol step at a time by the test, against:

- a real SQLite store in a temporary file (``synchronous=normal``: commits stay atomic and
  survive a process crash; only power loss is out of scope), wrapped by
  :class:`FaultyStore` so that commits can fail with a conflict, report an unknown
  result (``CommitUnknownResultError``, as FoundationDB does) after being applied, without
  being applied, or while still in flight (the commit lands later, after the worker has
  looked, if nothing it read changed meanwhile), take longer than the
  five-second limit, or the store can be unavailable; latency is modelled by running
  other steps while a worker's transaction is being created or committed
  (:meth:`FaultPlan.stall`);
- :class:`SimNetwork`, an in-process :class:`~millstream.rpc.client.RowsClient` that drops,
  duplicates, delays and reorders GetRows requests and responses, and can run other steps
  between a reducer's state read, the mappers' answers and the reducer's commit (so a
  response is stale by the time it is reduced);
- :class:`SimInput`, an in-memory replayable input whose partitions grow, can be
  unavailable, can be slow (other steps run while a read waits), and, like a real queue,
  forget trimmed rows (a read below the trim point raises :class:`TrimmedInputError`, as
  :class:`~millstream.inputs.StoreQueue` does);
- a :class:`~millstream.testing.ManualClock`, time that moves only when the harness says
  so; the store's transaction-age check reads it too;
- :class:`SimProducer`, a producer appending to a real :class:`StoreQueue` in the faulty
  store through a named :class:`QueueProducer`, whose every appended row must be in the
  queue exactly once.

The user's map either sends each mapped row on its own or pre-aggregates a batch (one row
per reducer), so the shuffle numbering depends on where batches are cut, as with a real
combining map; :class:`Oracle` learns the cuts from the map calls.

There are no threads, no wall-clock reads and no random numbers: worker GUIDs are
sequential and one sequence of steps (:attr:`Simulation.steps`) always replays the same way
(:func:`replay`). The harness records a trace of what every step did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shutil
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import millstream as ms
import pyarrow as pa
import pyarrow.ipc
from millstream._core import SHUFFLE_INDEX_COLUMN
from millstream.exceptions import (
    CommittedIndexError,
    CommitUnknownResultError,
    InputError,
    MapperSupersededError,
    MillstreamError,
    RetryableStoreError,
    SplitBrainError,
    StaleMapperError,
    StoreConflictError,
    StoreUnavailableError,
    TransactionTooLargeError,
)
from millstream.inputs.base import ReadResult
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import (
    RescalePlan,
    check_processor_info,
    freshest_workers,
    list_workers,
    read_mapper_state,
    read_reducer_state,
    reducer_state_key,
    register_worker,
    unregister_worker,
)
from millstream.ledger.rescale import begin_rescale, finish_rescale
from millstream.ledger.spill import spill_pending
from millstream.ledger.subspaces import SYSTEM
from millstream.processor import Processor
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.state import Store, open_store, pack
from millstream.state.retry import run_transaction
from millstream.testing import InProcessTransport, ManualClock
from millstream.workers import MapperWorker, ReducerWorker

# -- the user's code: every row's effect is a counter keyed by its identity ------------

Item = tuple[int, int]
"""One mapped row's identity within its mapper: ``(input row, copy)``."""

Group = tuple[int, tuple[Item, ...]]
"""One shuffled row: its reducer and the mapped rows it carries."""


def fanout(mapper: int, row: int) -> int:
    """How many rows ``map`` makes of one input row: 0, 1 or 2 (0 exercises empty output)."""
    return (row * 7 + mapper * 3 + 1) % 3


def reducer_of(mapper: int, row: int, copy: int, num_reducers: int) -> int:
    """The reducer of one mapped row (deterministic, spread over reducers)."""
    return (mapper * 31 + row * 17 + copy * 5) % num_reducers


def map_rows(
    mapper: int, rows: Sequence[int], num_reducers: int, preaggregate: bool
) -> list[Group]:
    """What the user's map makes of one batch of input rows, in shuffle order.

    Row-wise: one shuffled row per mapped row. Pre-aggregating: one shuffled row per reducer
    (in order of first appearance) carrying all of the batch's rows for it, so the result
    depends on the batch's boundaries.
    """
    items = [
        (row, copy, reducer_of(mapper, row, copy, num_reducers))
        for row in rows
        for copy in range(fanout(mapper, row))
    ]
    if not preaggregate:
        return [(red, ((row, copy),)) for row, copy, red in items]
    groups: dict[int, list[Item]] = {}
    for row, copy, red in items:
        groups.setdefault(red, []).append((row, copy))
    return [(red, tuple(its)) for red, its in groups.items()]


COPIES = 4
"""Items travel as ``row * COPIES + copy``."""


class SimMapper(ms.Mapper):
    """A deterministic map; ``config["preaggregate"]`` picks the batch-dependent variant.

    ``config["observe"]``, if set, is told the input range of every batch mapped.
    """

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        rows = batch.column("row").to_pylist()
        mappers = set(batch.column("mapper").to_pylist())
        assert len(mappers) == 1
        assert rows == list(range(rows[0], rows[0] + len(rows)))
        m = mappers.pop()
        groups = map_rows(m, rows, self.spec.num_reducers, bool(self.config["preaggregate"]))
        observe = self.config.get("observe")
        if observe is not None:
            observe(m, rows[0], rows[-1] + 1)
        out = pa.record_batch(
            {
                "mapper": pa.array([m] * len(groups), pa.int64()),
                "items": pa.array(
                    [[row * COPIES + copy for row, copy in its] for _, its in groups],
                    pa.list_(pa.int64()),
                ),
                "pad": pa.array([f"payload-{its[0][0]}" for _, its in groups], pa.string()),
            }
        )
        return ms.Partitioned.with_indices(out, [red for red, _ in groups])


EFFECT = ("effect",)


EMITTED = "emitted"
"""The output queue every reducer appends its effects to (a pipeline's first stage)."""


class SimReducer(ms.Reducer):
    """Applies one counter increment per mapped row received, through the commit
    transaction, and appends the same effects to the output queue :data:`EMITTED`: the
    queue must hold every effect as often as its counter counts it."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        apply_effects(batch.column("mapper"), batch.column("items"), txn, self.config)


def apply_effects(
    mappers: pa.Array | pa.ChunkedArray,
    items: pa.Array | pa.ChunkedArray,
    txn: ms.Transaction,
    config: Any,
) -> None:
    """One counter increment per mapped row item (and the same effects to the output
    queue when ``config["emit"]``)."""
    emitted: list[int] = []
    for m, codes in zip(mappers.to_pylist(), items.to_pylist(), strict=True):
        for code in codes:
            txn.add((*EFFECT, m, code // COPIES, code % COPIES), 1)
            emitted.append(m * 1_000_000 + code)
    if config.get("emit"):
        txn.append(EMITTED, pa.table({"effect": pa.array(emitted, pa.int64())}))


class SimQueueReducer(ms.QueueReducer):
    """:class:`SimReducer` as a persistent-queue reducer: each round it marks about two
    pending rows in three finished (a deterministic function of the row and the round, so
    replays repeat it; all of them once every mapper's input ended) and applies the effects
    of the rows the commit finishes only. Rows left pending come again; a finished row's
    effect must be applied exactly once whatever fails."""

    def hand_over(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        """A rescale: every pending row's effect is applied now, by its old owner (what
        the rows stand for needs no new owner)."""
        pending.finish_all()
        apply_effects(pending.rows["mapper"], pending.rows["items"], txn, self.config)

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        rows = pending.rows
        if len(pending.ended_mappers) == self.spec.num_partitions:
            pending.finish_all()
        else:
            salt = len(pending)
            pending.finish(
                [
                    (m * 31 + (items[0] if items else 0) + salt) % 3 != 0
                    for m, items in zip(
                        rows.column("mapper").to_pylist(),
                        rows.column("items").to_pylist(),
                        strict=True,
                    )
                ]
            )
        done = rows.filter(pending.finished())
        apply_effects(done["mapper"], done["items"], txn, self.config)


# -- time ----------------------------------------------------------------------------


SIM_START = 1_000.0
"""Where the simulation's :class:`~millstream.testing.ManualClock` starts."""

SIM_WALL_OFFSET = 1_700_000_000.0
"""Its wall clock: this plus its monotonic time."""


# -- input ---------------------------------------------------------------------------


@dataclass
class SimPartition:
    """One input partition: ``total`` rows, of which ``visible`` were produced so far."""

    index: int
    total: int
    visible: int
    trimmed: int = 0
    unavailable: bool = False
    trims: list[int] = field(default_factory=list)
    stalls: deque[list[Any]] = field(default_factory=deque)

    def batch(self, begin: int, end: int) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "mapper": pa.array([self.index] * (end - begin), pa.int64()),
                "row": pa.array(range(begin, end), pa.int64()),
            }
        )


class TrimmedInputError(InputError):
    """A read below a partition's trim point: those rows are gone."""


class SimReader:
    """A reader of a :class:`SimPartition`; the continuation token is the next row, as text.

    Like a queue with deleted prefix, rows below the trim point are gone: a read that starts
    there raises :class:`TrimmedInputError`, as real inputs do. Reads may be slow: an entry
    ``[n, fn]`` of the partition's ``stalls`` lets ``n`` more reads pass, then ``fn`` runs
    while the next one waits (before it looks at the partition).
    """

    def __init__(self, partition: SimPartition) -> None:
        self.partition = partition

    def read(self, begin_row_index: int, end_row_index_hint: int, token: bytes) -> ReadResult:
        p = self.partition
        _stall_read(p)
        if p.unavailable:
            raise InputError(f"partition {p.index} is unavailable (simulated)")
        start = int(token or b"0")
        if start < p.trimmed:
            raise TrimmedInputError(
                f"partition {p.index}: rows below {p.trimmed} were trimmed; cannot read from "
                f"row {start} (simulated)"
            )
        end = min(start + max(1, end_row_index_hint - begin_row_index), p.visible)
        if end <= start:
            return ReadResult(None, str(start).encode(), p.visible == p.total == start)
        return ReadResult(p.batch(start, end), str(end).encode(), p.visible == p.total == end)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        p = self.partition
        p.trims.append(row_index)
        p.trimmed = max(p.trimmed, row_index)

    def close(self) -> None:
        pass


def _stall_read(p: SimPartition) -> None:
    """Input latency: run the steps armed for this read while it waits."""
    if not p.stalls:
        return
    entry = p.stalls[0]
    if entry[0] > 0:
        entry[0] -= 1
        return
    p.stalls.popleft()
    entry[1]()


class SimInput:
    """A processor input of in-memory partitions."""

    def __init__(self, partitions: list[SimPartition]) -> None:
        self.partitions = partitions

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    def reader(self, partition: int) -> SimReader:
        return SimReader(self.partitions[partition])


# -- the store, with injected faults ---------------------------------------------------

COMMIT_FAULTS = (
    "conflict",
    "unknown",
    "unavailable",
    "too_old",
    "unknown_unapplied",
    "unknown_late",
)
"""``unknown``: applied, then reported unknown; ``unknown_unapplied``: reported unknown and
never applied; ``unknown_late``: reported unknown while still in flight, applied at the
next commit of any transaction (after the worker looked) unless what it read changed."""


class FaultPlan:
    """Faults the store injects.

    - ``armed``: commit faults, used by the next commits in order;
    - ``unavailable``: every transaction fails;
    - ``stalls``: latency. Each entry ``[n, fn]`` waits for ``n`` more store calls
      (transaction creations and commits, by any worker), then ``fn`` runs while the next
      one is pending: the steps in ``fn`` happen while that worker waits on the store.
    """

    def __init__(self, clock: ManualClock, note: Callable[[str], None]) -> None:
        self.clock = clock
        self.note = note
        self.armed: deque[str] = deque()
        self.unavailable = False
        self.injected: Counter[str] = Counter()
        self.stalls: deque[list[Any]] = deque()
        self._stalling = False
        self.in_flight: deque[Any] = deque()

    def next_commit_fault(self) -> str | None:
        if self.unavailable:
            return "unavailable"
        return self.armed.popleft() if self.armed else None

    def stall(self) -> None:
        """One store call is about to happen: run the latency armed for it, if any."""
        if not self.stalls or self._stalling:
            return
        entry = self.stalls[0]
        if entry[0] > 0:
            entry[0] -= 1
            return
        self.stalls.popleft()
        self.injected["stall"] += 1
        self.note("  store stalls")
        self._stalling = True
        try:
            entry[1]()
        finally:
            self._stalling = False

    # -- ambiguous commits that land late ----------------------------------------------

    def hold(self, inner: Any) -> None:
        """Keep ``inner``'s commit in flight: it lands at the next commit (:meth:`land`)."""
        inner._release(rollback=False)  # its writes and read set stay; the snapshot ends
        self.in_flight.append(inner)

    def land(self) -> None:
        """Commits in flight are applied now, each only if nothing it read has changed."""
        while self.in_flight:
            inner = self.in_flight.popleft()
            try:
                inner._raw_commit()  # conflict-checked against everything committed since
                self.injected["late_landed"] += 1
                self.note("  in-flight commit lands")
            except StoreConflictError:
                self.injected["late_aborted"] += 1
                self.note("  in-flight commit aborted (what it read changed)")


class FaultyTransaction:
    """A real transaction whose commit may fail, before or after being applied."""

    def __init__(self, inner: Any, plan: FaultPlan, fresh: Callable[[], Any]) -> None:
        self._inner = inner
        self._plan = plan
        self._fresh = fresh

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self) -> None:
        self._plan.stall()
        self._plan.land()
        fault = self._plan.next_commit_fault()
        if fault is not None:
            self._plan.injected[fault] += 1
            self._plan.note(f"  store fault: {fault}")
        if fault == "conflict":
            self._inner.reset()
            raise StoreConflictError("injected conflict (simulation)")
        if fault == "unavailable":
            self._inner.reset()
            raise StoreUnavailableError("injected: store unavailable (simulation)")
        if fault == "unknown_unapplied":
            self._inner.reset()
            raise CommitUnknownResultError("injected: commit not applied but reported unknown")
        if fault == "unknown_late":
            if self._inner._started is not None:
                self._inner._limits.check_age(self._plan.clock.now() - self._inner._started)
            inner, self._inner = self._inner, self._fresh()
            self._plan.hold(inner)
            raise CommitUnknownResultError("injected: commit in flight, reported unknown")
        if fault == "too_old":
            # The commit is slow: the transaction's age passes FoundationDB's five seconds.
            self._plan.clock.advance(6.0)
        self._inner.commit()
        if fault == "unknown":
            raise CommitUnknownResultError("injected: commit applied but reported unknown")


class FaultyStore:
    """A real store whose transactions go through :class:`FaultyTransaction`."""

    def __init__(self, inner: Store, plan: FaultPlan) -> None:
        self._inner = inner
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    read = Store.read  # reads go through the faulty create_transaction below

    def create_transaction(self) -> Any:
        self._plan.stall()
        if self._plan.unavailable:
            self._plan.injected["unavailable"] += 1
            self._plan.note("  store fault: unavailable")
            raise StoreUnavailableError("injected: store unavailable (simulation)")
        inner = self._inner
        return FaultyTransaction(inner.create_transaction(), self._plan, inner.create_transaction)

    def transact(
        self, fn: Callable[[Any], Any], *, idempotent: bool = False, max_retries: int | None = 20
    ) -> Any:
        """:meth:`Store.transact`'s retry loop, without sleeping between retries."""
        return run_transaction(
            self.create_transaction,
            fn,
            idempotent=idempotent,
            max_retries=max_retries,
            sleep=lambda seconds: None,
        )


# -- a producer appending to a store queue -------------------------------------------

QUEUE = "sim-input"
"""The store queue :class:`SimProducer` appends to."""

QUEUE_PARTITIONS = 2


class SimProducer:
    """Appends numbered rows to a real :class:`StoreQueue` in the faulty store.

    Its source is a list of batches per partition, batch ``k`` being append sequence ``k``
    of producer ``"sim-producer"``. Each append step makes a new batch and sends every
    batch not yet acknowledged, in order, each with its own sequence; an append that
    raises stays unacknowledged and is sent again (with the same sequence) next time. A
    restarted producer learns from the store where to resume
    (:meth:`QueueProducer.last_sequence`), as a real one would.
    """

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.queue = StoreQueue(sim.store, QUEUE, QUEUE_PARTITIONS)  # type: ignore[arg-type]
        self.reader = StoreQueue(sim.raw, QUEUE, QUEUE_PARTITIONS)
        self.producer = QueueProducer(self.queue, "sim-producer")
        self.batches: list[list[list[int]]] = [[] for _ in range(QUEUE_PARTITIONS)]
        self.acked = [0] * QUEUE_PARTITIONS
        self.resumed = [True] * QUEUE_PARTITIONS
        self.next_row = 0

    def append(self, partition: int, rows: int) -> None:
        """``rows`` new rows for ``partition``; send everything not yet acknowledged."""
        self.batches[partition].append(list(range(self.next_row, self.next_row + rows)))
        self.next_row += rows
        self.send(partition)

    def send(self, partition: int) -> None:
        if not self.resume(partition):
            return
        batches = self.batches[partition]
        while self.acked[partition] < len(batches):
            k = self.acked[partition]
            batch = pa.record_batch({"row": pa.array(batches[k], pa.int64())})
            try:
                got = self.producer.append(partition, batch, sequence=k)
            except STORE_ERRORS as exc:
                self.sim.events["producer_append_failed"] += 1
                self.sim.note(f"producer p{partition} seq {k}: {type(exc).__name__}")
                return
            self.sim.note(f"producer p{partition} seq {k}: rows {got}")
            self.acked[partition] = k + 1

    def restart(self) -> None:
        """A new producer process: it resumes after the last sequence the store holds."""
        self.producer = QueueProducer(self.queue, "sim-producer")
        self.resumed = [False] * QUEUE_PARTITIONS
        for p in range(QUEUE_PARTITIONS):
            self.resume(p)

    def resume(self, partition: int) -> bool:
        """After a restart, learn where to resume (once the store answers)."""
        if self.resumed[partition]:
            return True
        try:
            resume = self.producer.last_sequence(partition) + 1
        except STORE_ERRORS as exc:
            self.sim.note(f"producer p{partition} cannot resume yet: {type(exc).__name__}")
            return False
        self.sim.note(f"producer restarts: p{partition} resumes at seq {resume}")
        assert resume >= self.acked[partition], (
            f"queue partition {partition}: the store holds producer sequences up to "
            f"{resume - 1} but {self.acked[partition] - 1} was acknowledged"
        )
        self.acked[partition] = min(resume, len(self.batches[partition]))
        self.resumed[partition] = True
        return True

    def stored(self, partition: int) -> list[int]:
        """Every row in the queue partition, in order (read without faults)."""
        out: list[int] = []
        at = 0
        while True:
            result = self.reader.read(partition, at, 1 << 20)
            if result.batch is None or result.batch.num_rows == 0:
                return out
            out.extend(result.batch.column("row").to_pylist())
            at += result.batch.num_rows

    def check(self, *, complete: bool = False) -> None:
        """Every appended row is in the queue once, in order; acknowledged ones surely.

        The queue holds the first ``j`` batches for some ``j`` at least the number
        acknowledged (an unacknowledged append may have landed); ``complete``: all of them.
        """
        for p in range(QUEUE_PARTITIONS):
            have = self.stored(p)
            twice = sorted(row for row, n in Counter(have).items() if n > 1)
            assert not twice, f"queue partition {p} holds rows more than once: {twice[:10]}"
            batches = self.batches[p]
            prefixes = [
                list(itertools.chain.from_iterable(batches[:j])) for j in range(len(batches) + 1)
            ]
            lowest = len(batches) if complete else self.acked[p]
            assert any(have == prefixes[j] for j in range(lowest, len(batches) + 1)), (
                f"queue partition {p} holds rows {have[:20]}...({len(have)}), not the first "
                f"batches appended (at least {lowest} of {len(batches)}: "
                f"{prefixes[-1][:20]}...)"
            )

    def finish(self) -> None:
        """Faults off: send what is still unacknowledged."""
        self.sim.plan.land()
        for p in range(QUEUE_PARTITIONS):
            self.send(p)
            assert self.acked[p] == len(self.batches[p]), f"producer p{p} still failing"


class CommitHook:
    """A store whose first commit of a transaction that read ``key`` runs ``fn`` first.

    Latency aimed at one commit: ``fn``'s steps happen after the worker read and wrote
    everything and before its commit reaches the store.
    """

    def __init__(self, inner: Any, key: tuple[Any, ...], fn: Callable[[], None]) -> None:
        self._inner = inner
        self.key = key
        self.raw_key = inner.prefix_bytes + pack(key)
        self.fn: Callable[[], None] | None = fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    read = Store.read

    def create_transaction(self) -> Any:
        return _HookedTransaction(self._inner.create_transaction(), self)


class _HookedTransaction:
    def __init__(self, inner: Any, hook: CommitHook) -> None:
        self._inner = inner
        self._hook = hook
        self._read_key = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        if key == self._hook.key:
            self._read_key = True
        return self._inner.get(key, *args, **kwargs)

    def _raw_get(self, key: bytes, snapshot: bool) -> Any:
        # A transaction that wraps this one (the reducer's ReplayingTransaction) reads here.
        if key == self._hook.raw_key:
            self._read_key = True
        return self._inner._raw_get(key, snapshot)

    def commit(self) -> None:
        fn = self._hook.fn
        if self._read_key and fn is not None:
            self._hook.fn = None
            fn()
        self._inner.commit()


# -- worker instances -----------------------------------------------------------------


class WindowProbe:
    """A mapper's window, with a ledger of every entry's bytes and rows as pushed.

    The worker sees the real window through it. The ledger lets the checker compare the
    window's memory accounting, after any trimming, with the entries it still holds; the
    bounds, each entry's charge with what its rows take (an entry is charged what it
    holds, not the buffers its batch was sliced from).
    """

    def __init__(self, window: Any) -> None:
        self.window = window
        # entry index -> (bytes, rows, input rows begin, end) when pushed
        self.ledger: dict[int, tuple[int, int, int, int]] = {}
        # entry index -> most bytes the entry may be charged
        self.bounds: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.window, name)

    def push(self, batch: Any, indices: Any, end: int, token: bytes) -> Any:
        w = self.window
        before = w.snapshot()
        first, n = before.first_entry_index, before.num_entries
        result = w.push(batch, indices, end, token)
        after = w.snapshot()
        gone = range(first, after.first_entry_index)
        new = first + n
        if after.first_entry_index <= new:
            freed = [self.ledger[i] for i in gone]
            self.ledger[new] = (
                after.buffered_bytes - before.buffered_bytes + sum(e[0] for e in freed),
                after.buffered_rows - before.buffered_rows + sum(e[1] for e in freed),
                before.input_end_row_index,
                end,
            )
            # Twice its rows' own bytes (copied when its buffers hold more) plus 64 KiB,
            # and the index: 4 bytes per row and reducer boundary, the token, a header.
            rows_bytes = batch.nbytes if batch.num_rows else 0
            index = 4 * (batch.num_rows + after.num_reducers + 1) + len(token) + 1024
            self.bounds[new] = 2 * rows_bytes + 64 * 1024 + index
        for i in gone:
            self.ledger.pop(i, None)
            self.bounds.pop(i, None)
        return result


@dataclass
class MapperInstance:
    """A live mapper object, the address it serves on, and where its window started.

    ``restarting``: its loop must (re)start ingestion before the next step (after split
    brain, or when that restart failed on a store error). ``registration``: its number in
    discovery and its beat counter, kept across beats (and when an observer removed its
    entry).
    """

    worker: MapperWorker
    address: str
    started_shuffle: int = 0
    restarting: bool = False
    registration: int | None = None
    beats: int | None = None
    forged: bool = False
    """A forged GetRows reached this window: it may have dropped uncommitted rows (the
    store-side invariants still check that none is lost)."""


@dataclass
class ReducerInstance:
    """A live reducer object."""

    worker: ReducerWorker


NET_FAULTS = ("ok", "drop_request", "drop_response", "duplicate", "delay_request")

Action = tuple[Any, ...]
"""One step, e.g. ``("ingest", mapper, instance)``; see :meth:`Simulation.do`."""


class SimNetwork(InProcessTransport):
    """In-process GetRows with faults: routes a call by address to the instance bound there.

    Before a reducer iteration the simulation sets, for that one call, per-call faults and
    steps to run before the mappers answer and after (stale answers), and whether the calls
    are served in reverse order.
    """

    def __init__(self, sim: Simulation) -> None:
        super().__init__()
        self.sim = sim
        self.faults: Sequence[str] = ()
        self.before: Sequence[Action] = ()
        self.after: Sequence[Action] = ()
        self.reverse = False
        self.late: deque[GetRowsCall] = deque()
        self.unreachable: set[int] = set()

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        faults, before, after = self.faults, self.before, self.after
        self.faults, self.before, self.after = (), (), ()
        self.sim.run_nested(before)
        results: list[GetRowsResult | BaseException] = [TimeoutError("no answer") for _ in calls]
        order = list(range(len(calls)))
        if self.reverse:
            order.reverse()
        for i in order:
            call = calls[i]
            fault = faults[i] if i < len(faults) else "ok"
            if call.mapper_index in self.unreachable:
                results[i] = ConnectionError(f"mapper {call.mapper_index} unreachable (sim)")
                continue
            if fault == "drop_request":
                continue
            if fault == "delay_request":
                self.late.append(call)
                continue
            early = self.take_prefetched(call)
            if early is not None and fault != "drop_response":
                self.sim.note(f"  m{call.mapper_index}: the answer fetched during the commit")
                results[i] = early
                continue
            try:
                result = self.serve(call)
                if fault == "duplicate":
                    result = self.serve(call)
            except (ConnectionError, StaleMapperError, CommittedIndexError) as exc:
                self.sim.note(f"  m{call.mapper_index} call refused: {type(exc).__name__}")
                results[i] = exc
                continue
            if fault != "drop_response":
                results[i] = result
        self.sim.run_nested(after)
        return results

    def acknowledge_many(self, calls: Sequence[GetRowsCall]) -> None:
        for call in calls:
            if call.mapper_index in self.unreachable:
                continue
            try:
                self.serve(call)
            except Exception:  # an acknowledgement that fails is harmless
                continue

    def handler(self, address: str) -> MapperWorker | None:
        inst = self.sim.bound.get(address)
        return None if inst is None else inst.worker

    def serve(self, call: GetRowsCall) -> GetRowsResult:
        committed = self.sim.committed_index(call.reducer_index, call.mapper_index)
        if call.committed_row_index > committed:
            # A reducer reports only what it committed: anything beyond is a protocol bug
            # (the mapper's defence may hide its effect, this check does not).
            self.sim.false_claims.append(
                f"r{call.reducer_index} told m{call.mapper_index} it committed up to "
                f"{call.committed_row_index}; the store holds {committed}"
            )
        result = super().serve(call)
        if call.max_rows:
            self.sim.note(
                f"  m{call.mapper_index}@{call.mapper_guid} served r{call.reducer_index} "
                f"({call.committed_row_index}, {result.last_shuffle_row_index}] "
                f"{result.row_count} rows"
            )
        return result

    def deliver_late(self) -> None:
        """A delayed request finally reaches its mapper; nobody waits for the answer."""
        if not self.late:
            return
        call = self.late.popleft()
        if call.mapper_index in self.unreachable:
            return
        with contextlib.suppress(ConnectionError, StaleMapperError, CommittedIndexError):
            self.serve(call)


# -- the oracle --------------------------------------------------------------------------


class Oracle:
    """The rows every mapper must produce, in shuffle order.

    For a pre-aggregating map, the first map call at an input row fixes the batch starting
    there (the workers record batch boundaries before sending rows, so every later instance
    must cut the same way) and the shuffle numbering follows from the batches. Row by row,
    the numbering is known from the start.
    """

    def __init__(self, totals: Sequence[int], num_reducers: int, preaggregate: bool) -> None:
        self.totals = list(totals)
        self.num_reducers = num_reducers
        self.preaggregate = preaggregate
        # cuts[m][begin] = end of the batch of mapper m starting at input row begin
        self.cuts: list[dict[int, int]] = [{} for _ in totals]
        # shuffle_at[m][i] = shuffle index of the first row mapped from input row i, for
        # every batch boundary i
        self.shuffle_at: list[dict[int, int]] = [{0: 0} for _ in totals]
        # outputs[m][s] = the shuffled row of shuffle index s
        self.outputs: list[list[Group]] = [[] for _ in totals]
        self.end = [0 for _ in totals]
        self.recuts: list[str] = []
        self.rescaled_at = [0 for _ in totals]
        """Per mapper, the shuffle index the last rescale handed over at."""
        if not preaggregate:
            # Row by row, the numbering does not depend on the batches: every row is a
            # boundary.
            for m, total in enumerate(totals):
                for row in range(total):
                    self.outputs[m].extend(map_rows(m, [row], num_reducers, False))
                    self.shuffle_at[m][row + 1] = len(self.outputs[m])

    def observe(self, m: int, begin: int, end: int) -> None:
        """``map`` ran on input rows ``[begin, end)`` of mapper ``m``."""
        if not self.preaggregate:
            return
        if begin == self.end[m]:
            self.cuts[m][begin] = end
            self.outputs[m].extend(
                map_rows(m, range(begin, end), self.num_reducers, self.preaggregate)
            )
            self.shuffle_at[m][end] = len(self.outputs[m])
            self.end[m] = end
        elif self.cuts[m].get(begin) != end:
            self.recuts.append(
                f"mapper {m} mapped input rows [{begin}, {end}); the first batch there was "
                f"[{begin}, {self.cuts[m].get(begin)})"
            )

    def committed_effects(self, states: list[tuple[int, ...]]) -> set[tuple[int, int, int]]:
        """Effects implied by every reducer's committed indices: exactly those rows (and
        every row before the last rescale's cut, which the reducers then had committed)."""
        out = set()
        for m, base in enumerate(self.rescaled_at):
            out.update(self.effects_before(m, base))
        for r, committed in enumerate(states):
            for m, last in enumerate(committed):
                for red, items in self.outputs[m][self.rescaled_at[m] : last + 1]:
                    if red == r:
                        out.update((m, row, copy) for row, copy in items)
        return out

    def rescale(self, num_reducers: int, persisted: list[tuple[int, int]]) -> None:
        """The reducers are now ``num_reducers``, every mapper's rows after its persisted
        ``(input, shuffle)`` point routed by the new count (and cut afresh)."""
        self.num_reducers = num_reducers
        for m, (cut, shuffle) in enumerate(persisted):
            assert self.shuffle_at[m].get(cut) == shuffle, (
                f"mapper {m} persisted ({cut}, {shuffle}) at the rescale, not a batch boundary"
            )
            del self.outputs[m][shuffle:]
            self.rescaled_at[m] = shuffle
            self.cuts[m] = {b: e for b, e in self.cuts[m].items() if e <= cut}
            self.shuffle_at[m] = {i: s for i, s in self.shuffle_at[m].items() if i <= cut}
            self.end[m] = cut
            if not self.preaggregate:
                for row in range(cut, self.totals[m]):
                    self.outputs[m].extend(map_rows(m, [row], num_reducers, False))
                    self.shuffle_at[m][row + 1] = len(self.outputs[m])

    def effects_before(self, m: int, shuffle: int) -> list[tuple[int, int, int]]:
        """Every effect of mapper ``m``'s shuffle rows below ``shuffle``."""
        return [(m, row, copy) for _, items in self.outputs[m][:shuffle] for row, copy in items]

    def all_effects(self) -> set[tuple[int, int, int]]:
        return {
            (m, row, copy)
            for m, total in enumerate(self.totals)
            for row in range(total)
            for copy in range(fanout(m, row))
        }


def effects_of_rows(m: int, end: int) -> list[tuple[int, int, int]]:
    """Every effect of mapper ``m``'s input rows below ``end`` (any batch cuts)."""
    return [(m, row, copy) for row in range(end) for copy in range(fanout(m, row))]


# -- the simulation ----------------------------------------------------------------------

CRASH_ERRORS = (InputError, ConnectionError)
"""Errors after which a worker process dies (its loop lets them out) and is restarted."""

STORE_ERRORS = (RetryableStoreError, StoreUnavailableError)
"""Errors a worker's loop notes and retries after a back-off (same instance)."""


@dataclass(frozen=True)
class SimConfig:
    """Everything a simulation starts from (with :attr:`Simulation.steps`, a full replay)."""

    totals: tuple[int, ...]
    num_reducers: int
    batch_rows: int
    commit_max_rows: int
    preaggregate: bool = False
    acknowledge_commits: bool = True
    memory_limit_bytes: int = 4096
    delivery: str = "exactly_once"
    emit: bool = False
    """Reducers also append their effects to an output queue (a pipeline's first stage),
    whose contents are checked against the effects. Off in some runs: the queue's end key
    makes duplicate reducers' commits conflict, which would hide bugs of the reducer's own
    guards from the simulation."""
    queue: bool = False
    """Reducers are persistent-queue reducers (:class:`SimQueueReducer`) that keep rows
    pending across rounds and finish a prefix per mapper (exactly once only)."""
    pipeline_fetch: bool = False
    """Reducers fetch their next rows before they commit (the simulated mappers answer at
    once, before the commit)."""

    @property
    def at_least_once(self) -> bool:
        return self.delivery == "at_least_once"


class Simulation:
    """M mappers and R reducers of the real worker classes, stepped one step at a time."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.steps: list[Action] = []
        self.trace: list[str] = []
        totals = list(config.totals)
        self.dir = tempfile.mkdtemp(prefix="millstream-sim-")
        self.partitions = [SimPartition(m, t, visible=t // 2) for m, t in enumerate(totals)]
        self.oracle = Oracle(totals, config.num_reducers, config.preaggregate)
        url = f"sqlite:///{os.path.join(self.dir, 'sim.db')}?synchronous=normal"
        self.emitted = StoreQueue(url, EMITTED, config.num_reducers, prefix=("sim",))
        self.processor = Processor(
            mapper=SimMapper,
            reducer=SimQueueReducer if config.queue else SimReducer,
            input=SimInput(self.partitions),
            outputs=[self.emitted] if config.emit else [],
            store=url,
            num_reducers=config.num_reducers,
            name="sim",
            config={
                "preaggregate": config.preaggregate,
                "observe": self.oracle.observe,
                "emit": config.emit,
            },
            tuning=ms.Tuning(
                batch_rows=config.batch_rows,
                memory_limit_bytes=config.memory_limit_bytes,
                commit_max_rows=config.commit_max_rows,
                get_rows_max_bytes=1 << 20,
                acknowledge_commits=config.acknowledge_commits,
                pipeline_fetch=config.pipeline_fetch,
            ),
            delivery=config.delivery,  # type: ignore[arg-type]
        )
        self.M, self.R = len(totals), config.num_reducers
        self.clock = ManualClock(SIM_START, SIM_WALL_OFFSET)
        self.raw: Store = open_store(self.processor.store, prefix=(self.processor.name,))
        self.raw.clock = self.clock.now
        self.plan = FaultPlan(self.clock, self.note)
        self.store = FaultyStore(self.raw, self.plan)
        self.net = SimNetwork(self)
        self.mappers: list[list[MapperInstance]] = [[] for _ in range(self.M)]
        self.reducers: list[list[ReducerInstance]] = [[] for _ in range(self.R)]
        self._rescaling = False
        self.bound: dict[str, MapperInstance] = {}
        self.hosts = 0
        self.guids = itertools.count(1)
        self.max_committed: list[list[int]] = [[-1] * self.M for _ in range(self.R)]
        self.false_claims: list[str] = []
        """GetRows calls that reported a committed index the store does not hold."""
        self.events: Counter[str] = Counter()
        self.nested_depth = 0
        self.busy: set[int] = set()
        self.producer: SimProducer | None = None  # made by the first append step
        for m in range(self.M):
            self.start_mapper(m)
        for r in range(self.R):
            self.start_reducer(r)

    def close(self) -> None:
        self.emitted.close()
        self.raw.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def note(self, line: str) -> None:
        """Add a line to the trace."""
        self.trace.append(line)

    def next_guid(self, role: str, index: int) -> str:
        """Sequential instance GUIDs: a replay creates the same ones."""
        return f"{role[0]}{index}-{next(self.guids):04d}"

    # -- lifecycle ------------------------------------------------------------------

    def start_mapper(self, m: int, address: str | None = None) -> MapperInstance:
        """A new mapper instance (new GUID) serving at ``address`` (default: a new host).

        A port a live instance still listens on cannot be bound (the workers' servers do not
        share ports): the new instance then listens on a new host, as a restarted worker
        whose port is taken binds another.
        """
        if address is None or any(i.address == address for insts in self.mappers for i in insts):
            self.hosts += 1
            address = f"host{self.hosts}:mapper{m}"
        worker = MapperWorker(
            self.processor,
            m,
            self.store,
            clock=self.clock,
            reader=SimReader(self.partitions[m]),
            guid=self.next_guid("mapper", m),
        )
        inst = MapperInstance(worker, address, restarting=True)
        self.note(f"start m{m}@{worker.guid} at {address}")
        self._mapper_step(inst, "start", lambda: None)
        self.mappers[m].append(inst)
        self.bound[address] = inst
        self.heartbeat(inst)
        return inst

    def restart_mapper(self, m: int, k: int) -> None:
        """Instance ``k`` dies and a new one starts on its port (same address, new GUID)."""
        inst = self._mapper(m, k)
        if inst is None:
            self.start_mapper(m)
            return
        self._kill(inst)
        self.start_mapper(m, inst.address)

    def crash_mapper(self, m: int, k: int) -> None:
        """The process dies: its object is gone, its discovery entry stays (stale)."""
        inst = self._mapper(m, k)
        if inst is not None:
            self._kill(inst)

    def heartbeat(self, inst: MapperInstance) -> None:
        """Refresh discovery: the instance's beat counter advances.

        The first beat registers the instance (the newest registration of its index, the
        one reducers use); a beat after an observer removed the entry re-creates it.
        """
        self.clock.advance(0.001)
        w = inst.worker
        txn = self.raw.create_transaction()
        info = register_worker(
            txn,
            "mapper",
            w.index,
            w.guid,
            inst.address,
            self.clock.wall(),
            pid=0,
            host="sim",
            registration=inst.registration,
            beats=inst.beats,
        )
        txn.commit()
        inst.registration, inst.beats = info.registration, info.beats
        self.note(f"heartbeat m{w.index}@{w.guid}")

    def heartbeats_stop(self, inst: MapperInstance) -> None:
        """The instance's beats stop reaching the store and an observer removes its entry."""
        w = inst.worker
        txn = self.raw.create_transaction()
        unregister_worker(txn, "mapper", w.index, w.guid)
        txn.commit()
        self.note(f"discovery forgets m{w.index}@{w.guid}")

    def start_reducer(self, r: int, *, duplicate: bool = False) -> None:
        worker = ReducerWorker(
            self.processor,
            r,
            self.store,
            self.net,
            clock=self.clock,
            guid=self.next_guid("reducer", r),
        )
        # As ReducerWorker.run finds it in the store: the old shape's run of a rescale.
        worker.rescaling = self._rescaling
        if not duplicate:
            self.reducers[r].clear()
        self.reducers[r].append(ReducerInstance(worker))
        self.note(f"start r{r}@{worker.guid}")

    def produce(self, m: int, n: int) -> None:
        """``n`` more rows of partition ``m`` arrive."""
        p = self.partitions[m]
        p.visible = min(p.total, p.visible + n)

    # -- protocol steps -------------------------------------------------------------

    def _mapper(self, m: int, k: int) -> MapperInstance | None:
        insts = self.mappers[m]
        return insts[k % len(insts)] if insts else None

    def _mapper_step(self, inst: MapperInstance, what: str, step: Callable[[], object]) -> object:
        """One step of the mapper's loop, with the loop's error handling.

        A step of an instance that is already in the middle of one (its ingestion thread
        is waiting on the store) is skipped: one instance ingests and trims in one thread.
        """
        w = inst.worker
        who = f"m{w.index}@{w.guid} {what}"
        if id(w) in self.busy:
            self.note(f"{who}: busy")
            return None
        self.busy.add(id(w))
        result: object = None
        try:
            if inst.restarting:
                w.start_ingestion()
                assert w.window is not None
                w.window = WindowProbe(w.window)  # type: ignore[assignment]
                inst.started_shuffle = w.window.local_state()[1]
                inst.restarting = False
                inst.forged = False
                self.note(f"{who}: ingestion starts at {w.window.local_state()[:2]}")
            result = step()
            self.note(f"{who}: {result}")
        except MapperSupersededError:
            # At least once: a newer instance took over; this one's loop returns.
            self.events["mapper_superseded"] += 1
            self.note(f"{who}: superseded")
            self._kill(inst)
            if not self.mappers[w.index]:
                # The instance that took over died meanwhile: the runner restarts it.
                self.start_mapper(w.index)
        except SplitBrainError:
            if self.config.at_least_once:
                # At least once the worker dies and the runner starts a new instance.
                self.events["mapper_split_brain_restart"] += 1
                self.note(f"{who}: split brain, the worker dies")
                self._kill(inst)
                if not self.mappers[w.index]:
                    self.start_mapper(w.index, inst.address)
                return result
            # The loop waits, drops the window and restarts ingestion (thesis 4.3.3 step 3).
            self.events["mapper_split_brain"] += 1
            self.note(f"{who}: split brain")
            inst.restarting = True
        except STORE_ERRORS as exc:
            self.events["mapper_store_error"] += 1
            self.note(f"{who}: {type(exc).__name__}")
        except TrimmedInputError as exc:
            # The local runner treats InputError as fatal: the whole run would stop.
            raise AssertionError(
                f"{who}: the run stops on {exc}; a read of rows another instance trimmed "
                "must restart ingestion (split brain), not fail"
            ) from exc
        except CRASH_ERRORS as exc:
            self.events["mapper_crashed"] += 1
            self.note(f"{who}: crashed on {type(exc).__name__}")
            self._kill(inst)
        finally:
            self.busy.discard(id(w))
        return result

    def _kill(self, inst: MapperInstance) -> None:
        m = inst.worker.index
        if inst in self.mappers[m]:
            self.mappers[m].remove(inst)
        if self.bound.get(inst.address) is inst:
            del self.bound[inst.address]
            # A nested restart may have started another instance on the same address
            # while this one still ran; once this one is gone, the port is that one's.
            alive = [i for insts in self.mappers for i in insts if i.address == inst.address]
            if alive:
                self.bound[inst.address] = alive[-1]
        self.note(f"kill m{m}@{inst.worker.guid}")

    def ingest_instance(self, inst: MapperInstance) -> bool:
        """One ingestion step; returns whether rows were appended to the window."""
        window = inst.worker.window
        if window is not None and not inst.restarting and not window.wait_for_room(0):
            self.events["mapper_window_full"] += 1
            self.note(f"m{inst.worker.index}@{inst.worker.guid} ingest: window full")
            return False
        return self._mapper_step(inst, "ingest", inst.worker.ingest_once) is True

    def ingest(self, m: int, k: int) -> None:
        inst = self._mapper(m, k)
        if inst is not None:
            self.ingest_instance(inst)

    def trim_instance(self, inst: MapperInstance) -> None:
        self._mapper_step(inst, "trim", inst.worker.trim_input_rows)

    def trim(self, m: int, k: int) -> None:
        inst = self._mapper(m, k)
        if inst is not None:
            self.trim_instance(inst)

    def spill(self, m: int, k: int) -> None:
        """Instance ``k`` of mapper ``m`` spills the rows of its oldest entries that some
        reducer has moved past, for the reducers still waiting for them."""
        inst = self._mapper(m, k)
        if inst is None:
            return
        # Every reducer counts as a straggler and every qualifying row goes: whoever the
        # mapper deems one, the rows it spills must reach their reducer exactly once.
        spill = inst.worker.spill_stragglers
        if self._mapper_step(inst, "spill", lambda: spill(range(self.R), 0)):
            self.events["mapper_spilled"] += 1

    def spilled_rows(self) -> dict[tuple[int, int], dict[int, tuple[int, ...]]]:
        """Every spilled row in the store: (reducer, mapper) -> shuffle index -> the mapped
        rows it carries (as item codes)."""
        out: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
        txn = self.raw.create_transaction()
        try:
            chunks = txn.get_range_startswith((*SYSTEM, "spill"))
        finally:
            txn.reset()
        for key, value in chunks:
            r, m = int(key[-3]), int(key[-2])
            table = pa.ipc.open_stream(value).read_all()
            rows = out.setdefault((r, m), {})
            for index, items in zip(
                table.column(SHUFFLE_INDEX_COLUMN).to_pylist(),
                table.column("items").to_pylist(),
                strict=True,
            ):
                assert rows.setdefault(index, tuple(items)) == tuple(items), (
                    f"spilled shuffle row {index} of mapper {m} for reducer {r} holds "
                    "different rows in two chunks"
                )
        return out

    def spilled_effects(self) -> set[tuple[int, int, int]]:
        """The effects of every spilled row (durable in the store, not yet committed)."""
        return {
            (m, code // COPIES, code % COPIES)
            for (_, m), rows in self.spilled_rows().items()
            for items in rows.values()
            for code in items
        }

    def reduce(
        self,
        r: int,
        k: int,
        faults: Sequence[str] = (),
        before: Sequence[Action] = (),
        after: Sequence[Action] = (),
        reverse: bool = False,
    ) -> bool:
        """One reducer iteration; returns whether it committed."""
        insts = self.reducers[r]
        if not insts:
            return False
        inst = insts[k % len(insts)]
        w = inst.worker
        if id(w) in self.busy:
            self.note(f"r{r}@{w.guid} reduce: busy")
            return False
        committed = False
        self.net.faults, self.net.before, self.net.after = faults, before, after
        self.net.reverse = reverse
        self.nested_depth += 1
        self.busy.add(id(w))
        try:
            committed = w.run_once()
            if committed:
                self.events["reducer_commit"] += 1
            self.note(f"r{r}@{w.guid} reduce: {committed} {w.last_state}")
        except STORE_ERRORS as exc:
            self.events["reducer_store_error"] += 1
            self.note(f"r{r}@{w.guid} reduce: {type(exc).__name__}")
        except TransactionTooLargeError:
            # Fatal for the worker (one row's writes exceed the limit); the runner restarts
            # the process.
            self.events["reducer_crashed"] += 1
            self.note(f"r{r}@{w.guid} reduce: crashed on TransactionTooLargeError")
            if inst in insts:
                insts.remove(inst)
            if not insts:
                self.start_reducer(r)
        finally:
            self.busy.discard(id(w))
            self.nested_depth -= 1
            self.net.faults, self.net.before, self.net.after = (), (), ()
        return committed

    def reduce_all(self) -> bool:
        """Every reducer's first instance reduces once; returns whether any committed."""
        return sum(self.reduce(r, 0) for r in range(self.R)) > 0

    def run_nested(self, actions: Sequence[Action]) -> None:
        """Steps that happen while a worker waits on the network or the store."""
        for action in actions:
            self.do(action, nested=True)

    def arm_stall(self, after_calls: int, fn: Callable[[], None]) -> None:
        """Latency: ``fn`` runs while the store call ``after_calls`` calls from now waits."""
        self.plan.stalls.append([after_calls, fn])

    # -- composite steps ----------------------------------------------------------------

    def _b_overtakes_a(
        self, m: int, a_lead: bool, grow: int
    ) -> tuple[MapperInstance, MapperInstance]:
        """Two live instances A (older) and B of mapper ``m``; B maps past A.

        With ``a_lead``, A first maps every full batch of the input so far (and a row
        arrives if none is left). B then maps all there is, its last batch cut short by the
        end of the input; the reducers commit everything, and ``grow`` more rows arrive.
        """
        if len(self.mappers[m]) < 2:
            self.start_mapper(m)
        a, b = self.mappers[m][0], self.mappers[m][-1]
        p, batch_rows = self.partitions[m], self.config.batch_rows
        for _ in range(8):
            w = a.worker.window
            if not a_lead or a.restarting or w is None:
                break
            if p.visible - w.snapshot().input_end_row_index < batch_rows:
                break
            if not self.ingest_instance(a):
                break
        w = a.worker.window
        if a_lead and w is not None and p.visible == w.snapshot().input_end_row_index:
            self.produce(m, 1)  # so that B's last batch is a short one
        self.heartbeat(b)
        for _ in range(12):
            if not self.ingest_instance(b):
                break
            self.reduce_all()
        for _ in range(8):
            if not self.reduce_all():
                break
        self.produce(m, grow)
        return a, b

    def split_brain_race(
        self, m: int, a_lead: bool, grow: int, stall: int | None, a_ingests: int
    ) -> None:
        """The sequence the mapper's split-brain check exists for (thesis 4.3.3 step 3).

        Two live instances A (older) and B of mapper ``m``, with the store, the partition
        and the network up. With ``a_lead``, A first maps every full batch of the input so
        far (and a row arrives if none is left). B then maps all there is, its last batch
        cut short by the end of the input; the reducers commit everything, and ``grow``
        more rows arrive. B persists its state and trims the input, B's entry leaves
        discovery (its beats stop reaching the store) so the reducers turn to A, and A
        ingests from where its stale window ends, below B's trim point, where there is now
        more input than when that batch was first cut; the reducers fetch from A and
        commit. With ``stall`` set, B's trim and the discovery change happen while A's
        ingestion waits on its ``stall``-th store call instead of before it.
        """
        self.plan.unavailable = False
        self.partitions[m].unavailable = False
        self.net.unreachable.discard(m)
        a, b = self._b_overtakes_a(m, a_lead, grow)

        def trim_b_then_beat_a() -> None:
            self.note("stall: B trims, discovery forgets B, A heartbeats")
            self.trim_instance(b)
            self.heartbeats_stop(b)
            self.heartbeat(a)

        if stall is None:
            trim_b_then_beat_a()
        else:
            self.arm_stall(stall, trim_b_then_beat_a)
        for _ in range(a_ingests):
            self.ingest_instance(a)
            self.reduce_all()

    def restart_mid_stream(self, m: int, grow: int, ingests: int) -> None:
        """A mapper restarts with batches sent but not persisted, and its input grew since.

        The new instance must cut the batches it re-reads where the old one did (a
        pre-aggregating map numbers its rows per batch), whatever the input has now.
        """
        inst = self._mapper(m, -1)
        if inst is None:
            inst = self.start_mapper(m)
        self.ingest_instance(inst)
        self.reduce_all()
        self._kill(inst)
        self.produce(m, grow)
        new = self.start_mapper(m, inst.address)
        for _ in range(ingests):
            self.ingest_instance(new)
            self.reduce_all()

    def append_to_queue(
        self, partition: int, rows: int, faults: Sequence[str], restart: bool = False
    ) -> None:
        """The producer appends ``rows`` rows, its commits meeting ``faults`` first.

        ``restart``: the producer process restarts first (and resumes from the store).
        """
        if self.producer is None:
            try:
                self.producer = SimProducer(self)
            except STORE_ERRORS as exc:
                self.note(f"producer cannot open the queue: {type(exc).__name__}")
                return
        if restart:
            self.producer.restart()
        self.plan.armed.extendleft(reversed(faults))
        self.producer.append(partition, rows)

    # -- composite steps: a duplicate reading behind a trim, racing reducers, reused
    # -- addresses, time passing ------------------------------------------------------

    def _faults_off(self) -> None:
        """Store, network and inputs up, no armed faults or latency (for a composite step).

        Commits still in flight land first, so the step starts from a settled store.
        """
        self.plan.land()
        self.plan.unavailable = False
        self.plan.armed.clear()
        self.plan.stalls.clear()
        self.net.unreachable.clear()
        for p in self.partitions:
            p.unavailable = False

    def reassign_partitions(self, num_mappers: int) -> None:
        """The processor restarts with ``num_mappers`` mapper workers: every partition's
        instances die and each partition starts again in the worker that now reads it (a
        new host per worker). Its records are the partition's, whichever worker reads it."""
        for m in range(self.M):
            for inst in list(self.mappers[m]):
                self._kill(inst)
        self.hosts += 1
        for m in range(self.M):
            self.start_mapper(m, f"host{self.hosts}-worker{m % num_mappers}:mapper{m}")

    def rescale(self, num_reducers: int) -> None:
        """Stop everything, rescale to ``num_reducers`` (:mod:`millstream.ledger.rescale`):
        fresh workers of the old shape commit every row up to the cut, faults off, then
        one transaction hands over and workers of the new shape start."""
        if self.config.at_least_once or num_reducers == self.R:
            return
        self._faults_off()
        self.net.late.clear()
        for m in range(self.M):
            for inst in list(self.mappers[m]):
                self._kill(inst)
        self.reducers = [[] for _ in range(self.R)]

        def begin(txn: Any) -> RescalePlan:
            check_processor_info(txn, self.processor.info)  # recorded as a runner does
            return begin_rescale(txn, self.processor.info, num_reducers)

        plan = self.raw.transact(begin)
        self.note(f"rescale to {num_reducers} reducers: old reducers commit up to {plan.committed}")
        for m in range(self.M):
            self.start_mapper(m)
        self._rescaling = True
        for r in range(self.R):
            self.start_reducer(r)
        self._rescaling = False
        for _ in range(200):
            for m in range(self.M):
                for inst in list(self.mappers[m]):
                    self.ingest_instance(inst)
            self.reduce_all()
            for m in range(self.M):
                for inst in list(self.mappers[m]):
                    self.trim_instance(inst)
            self.check()
            if self._all_mappers_drained() and not self._spill_waits():
                break
        assert self._all_mappers_drained(), "the old reducers' run did not drain"
        assert not self._spill_waits(), "the old reducers' run left spilled rows"
        for insts in self.mappers:
            for inst in insts:
                inst.worker.mark_drained()

        def hand_over(txn: Any) -> None:
            old = self.R
            finish_rescale(txn, plan)
            self.processor.reducer.on_rescale(ms.Transaction(txn), old, num_reducers)

        self.raw.transact(hand_over)
        _, mstates, _ = self.read_store()
        for m in range(self.M):
            for inst in list(self.mappers[m]):
                self._kill(inst)
        self.oracle.rescale(
            num_reducers,
            [(ps.input_unread_row_index, ps.shuffle_unread_row_index) for ps in mstates],
        )
        self.processor = dataclasses.replace(self.processor, num_reducers=num_reducers)
        self.R = num_reducers
        self.max_committed = [
            [ps.shuffle_unread_row_index - 1 for ps in mstates] for _ in range(self.R)
        ]
        self.reducers = [[] for _ in range(self.R)]
        for m in range(self.M):
            self.start_mapper(m)
        for r in range(self.R):
            self.start_reducer(r)
        self.events["rescaled"] += 1

    def trimmed_read_race(self, m: int, grow: int, a_ingests: int) -> None:
        """A duplicate mapper reads input rows while the other instance trims them.

        Two live instances A (older) and B of mapper ``m``. A maps every full batch of the
        input so far and a row arrives; B maps all there is, its last batch cut short by
        the end of the input; the reducers commit everything and ``grow`` more rows arrive.
        A's next read returns more rows than B's short batch, so A re-reads exactly B's
        rows, and while that read waits B persists its state and trims the input past
        them: the read fails on trimmed rows and A must restart (split brain). A then
        ingests ``a_ingests`` times with the reducers running.
        """
        self._faults_off()
        a, b = self._b_overtakes_a(m, True, grow)
        p = self.partitions[m]

        def b_trims() -> None:
            self.note("input stalls: B trims while A reads")
            self.trim_instance(b)

        entry: list[Any] = [1, b_trims]  # A's second read: the re-read of B's short batch
        p.stalls.append(entry)
        self.ingest_instance(a)
        p.stalls = deque(e for e in p.stalls if e is not entry)
        for _ in range(a_ingests):
            self.ingest_instance(a)
            self.reduce_all()

    def reducer_race(self, r: int, ingests: int) -> None:
        """Two instances of reducer ``r`` reduce the same rows (thesis 4.4.2 step 6).

        The mappers map ``ingests`` batches each; the first instance reads its state,
        fetches, reduces and re-reads its state, and while its commit waits the second
        instance fetches the same rows, reduces and commits. The first commit must fail:
        the state it re-read changed before it committed.
        """
        self._faults_off()
        for m in range(self.M):
            if not self.mappers[m]:
                self.start_mapper(m)
            self.produce(m, self.config.batch_rows * ingests)
            for inst in list(self.mappers[m]):
                for _ in range(ingests):
                    self.ingest_instance(inst)
        if len(self.reducers[r]) < 2:
            self.start_reducer(r, duplicate=True)
        first, second = self.reducers[r][0].worker, len(self.reducers[r]) - 1

        def second_reduces() -> None:
            self.note(f"commit waits: r{r} instance {second} reduces")
            self.reduce(r, second)

        hooked = CommitHook(self.store, reducer_state_key(r), second_reduces)
        first.store = hooked  # type: ignore[assignment]
        try:
            self.reduce(r, 0)
        finally:
            first.store = self.store  # type: ignore[assignment]

    def reuse_address(self, m: int, other: int) -> None:
        """The instance discovery names for mapper ``m`` dies and mapper ``other`` starts on
        its address (the port is free again) and maps a batch or two."""
        if other == m:
            return
        txn = self.raw.create_transaction()
        try:
            entry = freshest_workers(list_workers(txn, "mapper")).get(m)
        finally:
            txn.reset()
        inst = self.bound.get(entry.address) if entry is not None else None
        if inst is None or inst.worker.index != m:
            return
        self._kill(inst)
        new = self.start_mapper(other, inst.address)
        self.produce(other, self.config.batch_rows)
        for _ in range(2):
            self.ingest_instance(new)

    def address_reuse(self, m: int, shift: int, r: int) -> None:
        """A reducer's GetRows reaches another mapper index on the address it looked up.

        Reducer ``r`` reads discovery, which names an instance of mapper ``m``; before its
        call arrives, that instance dies and mapper ``m + shift`` starts on the same
        address. The call carries ``m``'s GUID and must be refused.
        """
        self._faults_off()
        other = (m + shift) % self.M
        if not self.mappers[m]:
            self.start_mapper(m)
        self.reduce(r, 0, before=(("reuse_address", m, other),))

    def forge(self, m: int, k: int, r: int, ahead: int) -> None:
        """Someone outside the processor sends instance ``k`` of mapper ``m`` a GetRows
        claiming that reducer ``r`` committed ``ahead`` rows more than the store holds.

        The window drops those rows; the mapper must not persist its state past them, and
        restarts from its persisted state when it finds the claim beyond the store.
        """
        inst = self._mapper(m, k)
        if inst is None or inst.restarting or inst.worker.window is None:
            return
        claimed = self.committed_index(r, m) + ahead
        try:
            inst.worker.handle_get_rows(r, claimed, 0, 1 << 20, inst.worker.guid)
        except (CommittedIndexError, StaleMapperError) as exc:
            self.note(f"  forged GetRows to m{m}@{inst.worker.guid} refused: {exc}")
            return
        inst.forged = True
        self.events["forged_get_rows"] += 1
        self.note(f"  forged GetRows: m{m}@{inst.worker.guid} told r{r} committed {claimed}")

    def time_passes(self, periods: int) -> None:
        """``periods`` heartbeat periods pass; every live mapper instance beats once.

        Entries of dead instances stop changing, so reducers that look before and after
        long enough find them dead and remove them.
        """
        self.clock.advance(periods * self.processor.tuning.heartbeat_seconds)
        for insts in self.mappers:
            for inst in list(insts):
                self.heartbeat(inst)

    # -- steps by name ------------------------------------------------------------------

    def step(self, action: Action) -> None:
        """Run one top-level step and record it (for :func:`replay`)."""
        self.steps.append(action)
        self.note(f"step {action!r}")
        self.do(action)

    def do(self, action: Action, *, nested: bool = False) -> None:
        """One step named by a tuple; ``nested``: inside another worker's wait."""
        kind, *args = action
        if kind == "ingest":
            self.ingest(args[0] % self.M, args[1])
        elif kind == "trim":
            self.trim(args[0] % self.M, args[1])
        elif kind == "reduce":
            if not nested:
                self.reduce(args[0] % self.R, *args[1:])
            elif self.nested_depth < 2:
                self.reduce(args[0] % self.R, args[1])
        elif kind == "restart_mapper":
            self.restart_mapper(args[0] % self.M, args[1])
        elif kind == "crash_mapper":
            self.crash_mapper(args[0] % self.M, args[1])
        elif kind == "duplicate_mapper":
            if len(self.mappers[args[0] % self.M]) < 2:
                self.start_mapper(args[0] % self.M)
        elif kind == "restart_reducer":
            r, duplicate = args[0] % self.R, args[1]
            if not (duplicate and len(self.reducers[r]) >= 2):
                self.start_reducer(r, duplicate=duplicate)
        elif kind == "commit_fault":
            self.plan.armed.extend([args[0]] * (args[1] if len(args) > 1 else 1))
        elif kind == "store_down":
            self.plan.unavailable = args[0]
        elif kind == "partition_down":
            self.partitions[args[0] % self.M].unavailable = args[1]
        elif kind == "mapper_unreachable":
            if args[1]:
                self.net.unreachable.add(args[0] % self.M)
            else:
                self.net.unreachable.discard(args[0] % self.M)
        elif kind == "produce":
            self.produce(args[0] % self.M, args[1])
        elif kind == "deliver_late":
            self.net.deliver_late()
        elif kind == "heartbeat":
            inst = self._mapper(args[0] % self.M, args[1])
            if inst is not None:
                self.heartbeat(inst)
        elif kind == "store_latency":
            inner = tuple(args[1])
            self.arm_stall(args[0], lambda: self.run_nested(inner))
        elif kind == "split_brain_race":
            self.split_brain_race(args[0] % self.M, *args[1:])
        elif kind == "restart_mid_stream":
            self.restart_mid_stream(args[0] % self.M, *args[1:])
        elif kind == "append":
            self.append_to_queue(args[0] % QUEUE_PARTITIONS, args[1], tuple(args[2]), *args[3:])

        elif kind == "forge":
            self.forge(args[0] % self.M, args[1], args[2] % self.R, args[3])
        elif kind == "trimmed_read_race":
            self.trimmed_read_race(args[0] % self.M, *args[1:])
        elif kind == "reducer_race":
            self.reducer_race(args[0] % self.R, *args[1:])
        elif kind == "reuse_address":
            self.reuse_address(args[0] % self.M, args[1] % self.M)
        elif kind == "address_reuse":
            self.address_reuse(args[0] % self.M, args[1], args[2] % self.R)
        elif kind == "time_passes":
            self.time_passes(args[0])
        elif kind == "spill":
            self.spill(args[0] % self.M, args[1])
        elif kind == "rescale":
            self.rescale(args[0])
        elif kind == "reassign_partitions":
            self.reassign_partitions(max(1, min(self.M, args[0])))
        else:
            raise ValueError(f"unknown action {action!r}")

    # -- observation ----------------------------------------------------------------

    def read_emitted(self) -> Counter[tuple[int, int, int]]:
        """How often each effect was appended to the output queue."""
        found: Counter[tuple[int, int, int]] = Counter()
        for p in range(self.emitted.num_partitions):
            at, end = 0, self.emitted.end_row_index(p)
            while at < end:
                batch = self.emitted.read(p, at, end - at).batch
                assert batch is not None, f"output queue partition {p} has no row {at}"
                for value in batch.column("effect").to_pylist():
                    m, code = divmod(value, 1_000_000)
                    found[(m, code // COPIES, code % COPIES)] += 1
                at += batch.num_rows
        return found

    def _check_emitted(self, effects: Counter[tuple[int, int, int]]) -> None:
        if not self.config.emit:
            return
        emitted = self.read_emitted()
        counted = Counter({k: v for k, v in effects.items() if v})
        assert emitted == counted, (
            "the output queue differs from the effects committed with it: "
            f"{sorted((emitted - counted).items())[:5]} only in the queue, "
            f"{sorted((counted - emitted).items())[:5]} only in the effects"
        )

    def read_store(self) -> tuple[list[tuple[int, ...]], list[Any], Counter[tuple[int, int, int]]]:
        txn = self.raw.create_transaction()
        try:
            states = [
                read_reducer_state(txn, r, self.M).committed_row_indices for r in range(self.R)
            ]
            mstates = [read_mapper_state(txn, m) for m in range(self.M)]
            effects: Counter[tuple[int, int, int]] = Counter()
            for key, raw in txn.get_range_startswith(("out", *EFFECT)):
                effects[(int(key[-3]), int(key[-2]), int(key[-1]))] = int.from_bytes(
                    raw, "little", signed=True
                )
        finally:
            txn.reset()
        return states, mstates, effects

    def committed_index(self, r: int, m: int) -> int:
        """Reducer ``r``'s committed index for mapper ``m`` in the store now."""
        if not 0 <= r < self.R:
            return -1
        txn = self.raw.create_transaction()
        try:
            return read_reducer_state(txn, r, self.M).committed_row_indices[m]
        finally:
            txn.reset()

    def dump_store(self) -> list[tuple[tuple[Any, ...], bytes]]:
        """Every key and value of the processor's store, in key order."""
        txn = self.raw.create_transaction()
        try:
            return list(txn.get_range_startswith(()))
        finally:
            txn.reset()

    def check(self) -> None:
        """Every safety invariant; raises AssertionError with what broke."""
        assert not self.false_claims, f"false commit claims: {self.false_claims[:3]}"
        if self.config.at_least_once:
            self.check_at_least_once()
            return
        states, mstates, effects = self.read_store()
        self._check_emitted(effects)
        twice = {k: v for k, v in effects.items() if v != 1}
        assert not twice, f"effects applied other than once: {sorted(twice.items())[:10]}"
        oracle = self.oracle
        for r, committed in enumerate(states):
            for m, c in enumerate(committed):
                # Committed indices never go backwards.
                assert c >= self.max_committed[r][m], (
                    f"reducer {r}'s committed index for mapper {m} went back from "
                    f"{self.max_committed[r][m]} to {c}"
                )
                self.max_committed[r][m] = c
                assert c < len(oracle.outputs[m]), (
                    f"reducer {r} committed mapper {m}'s shuffle row {c}, but the mapper's "
                    f"batches so far make only {len(oracle.outputs[m])} rows"
                )
        # The effects are exactly the rows the committed indices name.
        want = oracle.committed_effects(states)
        have = set(effects)
        assert have == want, (
            f"effects differ from the committed indices {states}: missing "
            f"{sorted(want - have)[:10]}, unexpected {sorted(have - want)[:10]}"
            + (f"; batches cut again differently: {oracle.recuts[:3]}" if oracle.recuts else "")
        )
        spilled = self.spilled_rows()
        for (r, m), rows in spilled.items():
            for index, items in rows.items():
                row = (r, tuple((code // COPIES, code % COPIES) for code in items))
                known = oracle.outputs[m][index] if index < len(oracle.outputs[m]) else None
                assert known == row, (
                    f"spilled shuffle row {index} of mapper {m} for reducer {r} is {row}, "
                    f"not the row mapped there ({known})"
                )
        parked = self.spilled_effects()
        for m, ps in enumerate(mstates):
            starts = oracle.shuffle_at[m]
            i = ps.input_unread_row_index
            assert i in starts, f"mapper {m} persisted input index {i}, not a batch boundary"
            assert ps.shuffle_unread_row_index == starts[i], (
                f"mapper {m} persisted state {ps} pairs input {i} with the wrong shuffle "
                f"index (want {starts[i]})"
            )
            missing = [
                e for e in oracle.effects_before(m, starts[i]) if e not in have and e not in parked
            ]
            assert not missing, (
                f"mapper {m}'s persisted state {ps} passed rows whose effect is not "
                f"committed: {missing[:10]}"
            )
            t = self.partitions[m].trimmed
            assert t <= i, f"partition {m} trimmed to {t} past its persisted state {ps}"
            assert t in starts, f"partition {m} trimmed to {t}, not a batch boundary"
            early = [
                e for e in oracle.effects_before(m, starts[t]) if e not in have and e not in parked
            ]
            assert not early, f"partition {m} trimmed to {t} before effects {early[:10]}"
        for m, insts in enumerate(self.mappers):
            for inst in insts:
                self._check_window(m, inst, states, spilled)
        if self.producer is not None:
            self.producer.check()

    def check_at_least_once(self) -> None:
        """The at-least-once invariants: nothing lost, whatever repeats.

        A mapper's persisted state and its input's trim point never pass an input row
        whose effects are not all committed (at least once), committed indices never go
        backwards, and every window keeps its accounting.
        """
        states, mstates, effects = self.read_store()
        self._check_emitted(effects)
        for r, committed in enumerate(states):
            for m, c in enumerate(committed):
                assert c >= self.max_committed[r][m], (
                    f"reducer {r}'s committed index for mapper {m} went back from "
                    f"{self.max_committed[r][m]} to {c}"
                )
                self.max_committed[r][m] = c
        assert all(v >= 1 for v in effects.values()), "an effect counted below once"
        parked = self.spilled_effects()
        for m, ps in enumerate(mstates):
            i = ps.input_unread_row_index
            missing = [e for e in effects_of_rows(m, i) if e not in effects and e not in parked]
            assert not missing, (
                f"mapper {m}'s persisted state {ps} passed rows whose effect is not "
                f"committed: {missing[:10]}"
            )
            t = self.partitions[m].trimmed
            assert t <= i, f"partition {m} trimmed to {t} past its persisted state {ps}"
        for insts in self.mappers:
            for inst in insts:
                w = inst.worker.window
                if w is not None:
                    self._check_window_accounting(inst, w)
        if self.producer is not None:
            self.producer.check()

    def _check_window_accounting(self, inst: MapperInstance, w: Any) -> None:
        """What a window counts is what its entries hold (any delivery mode)."""
        snap = w.snapshot()
        who = f"mapper {inst.worker.index} instance {inst.worker.guid}"
        _, shuffle_unread, _ = w.local_state()
        assert snap.buffered_rows <= snap.shuffle_end_row_index - shuffle_unread, (
            f"{who}: buffered_rows {snap.buffered_rows} but the window spans shuffle rows "
            f"[{shuffle_unread}, {snap.shuffle_end_row_index})"
        )
        pending_total = sum(w.bucket_len(r) for r in range(self.R))
        assert pending_total <= snap.buffered_rows, (
            f"{who}: buckets hold {pending_total} rows but the window {snap.buffered_rows}"
        )
        if snap.num_entries == 0:
            assert snap.buffered_rows == 0, f"{who}: no entries but {snap.buffered_rows} rows"
            assert snap.buffered_bytes == 0, f"{who}: no entries but {snap.buffered_bytes} bytes"
        counts = w.bucket_pointer_counts()
        assert len(counts) == snap.num_entries, f"{who}: {len(counts)} counts, {snap.num_entries}"
        nonempty = sum(1 for r in range(self.R) if w.bucket_len(r))
        assert sum(counts) == nonempty, (
            f"{who}: bucket pointer counts {counts} but {nonempty} non-empty buckets"
        )
        for r in range(self.R):
            pending = w.pending_shuffle_indices(r)
            assert len(pending) == w.bucket_len(r), f"{who}: bucket {r} length mismatch"
            assert all(a < b for a, b in itertools.pairwise(pending))

    def _check_window(
        self,
        m: int,
        inst: MapperInstance,
        states: list[tuple[int, ...]],
        spilled: dict[tuple[int, int], dict[int, tuple[int, ...]]],
    ) -> None:
        w = inst.worker.window
        if w is None:
            return
        snap = w.snapshot()
        input_unread, shuffle_unread, _ = w.local_state()
        end = snap.shuffle_end_row_index
        who = f"mapper {m} instance {inst.worker.guid}"
        # Memory accounting: what the window counts is what its entries held when pushed.
        if isinstance(w, WindowProbe):
            live = range(snap.first_entry_index, snap.first_entry_index + snap.num_entries)
            held = [w.ledger[i] for i in live]
            assert snap.buffered_bytes == sum(e[0] for e in held), (
                f"{who}: buffered_bytes {snap.buffered_bytes} but its {len(held)} entries were "
                f"pushed with {sum(e[0] for e in held)} bytes"
            )
            assert snap.buffered_rows == sum(e[1] for e in held), (
                f"{who}: buffered_rows {snap.buffered_rows} but its entries hold "
                f"{sum(e[1] for e in held)}"
            )
            assert all(e[0] > 0 for e in held), f"{who}: an entry of 0 bytes: {held}"
            over = [(i, w.ledger[i][0], w.bounds[i]) for i in live if w.ledger[i][0] > w.bounds[i]]
            assert not over, f"{who}: entries charged more than their rows hold: {over}"
            if self.oracle.preaggregate:
                # Every batch in the window is cut where the first instance cut it.
                cuts = self.oracle.cuts[m]
                recut = [e[2:] for e in held if e[2] < e[3] and cuts.get(e[2]) != e[3]]
                assert not recut, (
                    f"{who}: holds batches of input rows {recut} but the batches there were "
                    f"first cut as {[(b, cuts.get(b)) for b, _ in recut]}"
                )
        # Rows at or below a reducer's committed index are dropped on push, so the entries
        # hold at most the rows of their shuffle range and at least the buffered ones.
        self._check_window_accounting(inst, w)
        starts = self.oracle.shuffle_at[m]
        assert input_unread in starts, (
            f"{who}: local state at input {input_unread}, not a batch boundary"
        )
        assert shuffle_unread == starts[input_unread], (
            f"{who}: local state pairs input {input_unread} with shuffle {shuffle_unread}"
        )
        outs = self.oracle.outputs[m]
        for r in range(self.R):
            pending = w.pending_shuffle_indices(r)
            for s in pending:
                assert shuffle_unread <= s < end, f"{who}: bucket {r} holds row {s} out of range"
                assert s < len(outs), f"{who}: bucket {r} holds unknown shuffle row {s}"
                assert outs[s][0] == r, (
                    f"{who}: bucket {r} holds shuffle row {s} that is not reducer {r}'s"
                )
            committed = states[r][m]
            in_store = spilled.get((r, m), {})
            lost = [
                s
                for s in range(max(inst.started_shuffle, committed + 1), min(end, len(outs)))
                if outs[s][0] == r and s not in pending and s not in in_store
            ]
            assert not lost or inst.forged, (
                f"{who}: bucket {r} lost uncommitted shuffle rows {lost[:10]} "
                f"(reducer {r} committed {committed})"
            )

    # -- the end ----------------------------------------------------------------------

    def heal(self) -> None:
        """Faults off, every partition fully produced; the surviving instances go on.

        A worker with no live instance gets a new one (as the runner restarts a dead
        worker); duplicates stay, so the losers of a split brain must make progress too.
        """
        self.note("heal")
        self.plan.land()
        self.plan.armed.clear()
        self.plan.stalls.clear()
        self.plan.unavailable = False
        self.net.unreachable.clear()
        self.net.late.clear()
        for p in self.partitions:
            p.unavailable = False
            p.visible = p.total
            p.stalls.clear()
        for m in range(self.M):
            if not self.mappers[m]:
                self.start_mapper(m)
        for r in range(self.R):
            if not self.reducers[r]:
                self.start_reducer(r)

    def _spill_waits(self) -> bool:
        """Whether chunks spilled for some reducer are still in the store: a reducer's run
        goes on until none is (its ``all_drained``), even once every mapper has drained."""
        txn = self.raw.create_transaction()
        try:
            return any(spill_pending(txn, r) for r in range(self.R))
        finally:
            txn.reset()

    def _all_mappers_drained(self) -> bool:
        return all(
            not inst.restarting and inst.worker.is_drained()
            for insts in self.mappers
            for inst in insts
        )

    def drain(self, rounds: int = 400) -> None:
        """Run every surviving instance with faults off until all of them are done.

        Each round a heartbeat period passes and every live mapper instance beats, so
        reducers forget the entries of dead instances. Liveness: every row's effect is
        committed and every live instance, duplicates included, drains.
        """
        self.heal()
        everything = self.oracle.all_effects()
        for _ in range(rounds):
            self.time_passes(1)
            for m in range(self.M):
                for inst in list(self.mappers[m]):
                    self.ingest_instance(inst)
            for r in range(self.R):
                for k in range(len(self.reducers[r])):
                    self.reduce(r, k)
            for m in range(self.M):
                for inst in list(self.mappers[m]):
                    self.trim_instance(inst)
            self.check()
            _, _, effects = self.read_store()
            if set(effects) == everything and self._all_mappers_drained():
                break
        _, mstates, effects = self.read_store()
        missing = everything - set(effects)
        assert not missing, f"after draining, effects never applied: {sorted(missing)[:10]}"
        if self.config.at_least_once:
            repeated = sum(v - 1 for v in effects.values())
            if repeated:
                self.events["at_least_once_repeats"] += 1
            self.note(f"effects applied more than once: {repeated}")
        else:
            assert all(v == 1 for v in effects.values())
        for m in range(self.M):
            for inst in self.mappers[m]:
                worker = inst.worker
                stuck = inst.restarting or not worker.is_drained()
                assert not stuck, (
                    f"mapper {m} instance {worker.guid} did not drain in {rounds} rounds "
                    f"(a live instance must make progress): {worker.metrics()}"
                )
                worker.mark_drained()
            assert mstates[m].input_unread_row_index == self.partitions[m].total
            assert self.partitions[m].trimmed == self.partitions[m].total
        for r in range(self.R):
            for inst in self.reducers[r]:
                assert not inst.worker.run_once()
                assert inst.worker.all_drained, f"reducer {r} does not see every mapper drained"
        if self.producer is not None:
            self.producer.finish()
            self.producer.check(complete=True)
        self.note("drained")

    def replay_source(self) -> str:
        """Python that replays this run from the start (for a failure report)."""
        return (
            "from tests.simulation.harness import SimConfig, replay\n"
            f"replay({self.config!r}, {self.steps!r})"
        )


@dataclass(frozen=True)
class Outcome:
    """What a replayed run did: its trace and the store's final contents."""

    trace: list[str]
    store: list[tuple[tuple[Any, ...], bytes]]


def replay(config: SimConfig, steps: Sequence[Action], *, drain: bool = True) -> Outcome:
    """Run ``steps`` on a new simulation, checking every invariant after each, then drain.

    Raises:
        AssertionError: An invariant broke (the same one, at the same step, every time).
    """
    sim = Simulation(config)
    try:
        for action in steps:
            sim.step(action)
            sim.check()
        if drain:
            sim.drain()
        return Outcome(sim.trace, sim.dump_store())
    finally:
        sim.close()


def describe(err: BaseException) -> str:
    """One line for a caught error (used in events)."""
    return f"{type(err).__name__}: {err}"


__all__ = [
    "COMMIT_FAULTS",
    "NET_FAULTS",
    "MillstreamError",
    "Outcome",
    "SimConfig",
    "Simulation",
    "describe",
    "replay",
]
