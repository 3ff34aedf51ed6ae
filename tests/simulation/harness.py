"""A deterministic, in-process simulation of the whole shuffle protocol (thesis 4.3-4.6).

The REAL worker classes run here (:class:`MapperWorker`, :class:`ReducerWorker`), stepped
one protocol step at a time by the test, against:

- a real SQLite store in a temporary file, wrapped by :class:`FaultyStore` so that commits
  can fail with a conflict, fail *after being applied* (``CommitUnknownResultError``, as
  FoundationDB reports), or the store can be unavailable;
- :class:`SimNetwork`, an in-process :class:`~millstream.rpc.client.RowsClient` that drops,
  duplicates, delays and reorders GetRows requests and responses, and can run other steps
  between a reducer's state read, the mappers' answers and the reducer's commit (so a
  response is stale by the time it is reduced);
- :class:`SimInput`, an in-memory replayable input whose partitions can be unavailable and
  which, like a real queue, forgets trimmed rows (a read below the trim point returns the
  rows from the trim point on);
- :class:`SimClock`, time that moves only when the harness says so.

There are no threads and no wall-clock reads in the harness: one sequence of steps always
replays the same way. :class:`Checker` holds the oracle: the exact rows every mapper must
produce, in shuffle order, so the store's contents can be compared with the committed
indices after every step.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import millstream as ms
import pyarrow as pa
from millstream.exceptions import (
    CommittedIndexError,
    CommitUnknownResultError,
    InputError,
    MillstreamError,
    RetryableStoreError,
    SplitBrainError,
    StaleMapperError,
    StoreConflictError,
    StoreUnavailableError,
)
from millstream.inputs.base import ReadResult
from millstream.processor import Processor
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.state import Store, open_store
from millstream.state.records import (
    read_mapper_state,
    read_reducer_state,
    register_worker,
)
from millstream.workers import MapperWorker, ReducerWorker

# -- the user's code: every row's effect is a counter keyed by its identity ------------


def fanout(mapper: int, row: int) -> int:
    """How many rows ``map`` makes of one input row: 0, 1 or 2 (0 exercises empty output)."""
    return (row * 7 + mapper * 3 + 1) % 3


def reducer_of(mapper: int, row: int, copy: int, num_reducers: int) -> int:
    """The reducer of one mapped row (deterministic, spread over reducers)."""
    return (mapper * 31 + row * 17 + copy * 5) % num_reducers


class SimMapper(ms.Mapper):
    """Row-wise deterministic map: input row ``(mapper, row)`` becomes ``fanout`` rows."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        n = self.spec.num_reducers
        ms_, rows, copies, reducers = [], [], [], []
        for m, row in zip(
            batch.column("mapper").to_pylist(), batch.column("row").to_pylist(), strict=True
        ):
            for copy in range(fanout(m, row)):
                ms_.append(m)
                rows.append(row)
                copies.append(copy)
                reducers.append(reducer_of(m, row, copy, n))
        out = pa.record_batch(
            {
                "mapper": pa.array(ms_, pa.int64()),
                "row": pa.array(rows, pa.int64()),
                "copy": pa.array(copies, pa.int64()),
                "pad": pa.array([f"payload-{r}" for r in rows], pa.string()),
            }
        )
        return ms.Partitioned.with_indices(out, reducers)


EFFECT = ("effect",)


class SimReducer(ms.Reducer):
    """Applies one counter increment per received row, through the commit transaction."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        for m, row, copy in zip(
            batch.column("mapper").to_pylist(),
            batch.column("row").to_pylist(),
            batch.column("copy").to_pylist(),
            strict=True,
        ):
            txn.add((*EFFECT, m, row, copy), 1)


# -- time ----------------------------------------------------------------------------


class SimClock:
    """A clock that moves only through :meth:`advance` (and ``sleep``)."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        self.t += seconds

    def advance(self, seconds: float = 1.0) -> None:
        self.t += seconds


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

    def batch(self, begin: int, end: int) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "mapper": pa.array([self.index] * (end - begin), pa.int64()),
                "row": pa.array(range(begin, end), pa.int64()),
            }
        )


class SimReader:
    """A reader of a :class:`SimPartition`; the continuation token is the next row, as text.

    Like a queue with deleted prefix, rows below the trim point are gone: a read that starts
    there returns the rows from the trim point on (the reader cannot know the caller's
    numbering is off; the mapper's split-brain check is what protects it).
    """

    def __init__(self, partition: SimPartition) -> None:
        self.partition = partition

    def read(self, begin_row_index: int, end_row_index_hint: int, token: bytes) -> ReadResult:
        p = self.partition
        if p.unavailable:
            raise InputError(f"partition {p.index} is unavailable (simulated)")
        start = max(int(token or b"0"), p.trimmed)
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

COMMIT_FAULTS = ("conflict", "unknown", "unavailable")


class FaultPlan:
    """Faults the store injects: armed commit faults (used in order) and unavailability."""

    def __init__(self) -> None:
        self.armed: deque[str] = deque()
        self.unavailable = False
        self.injected: Counter[str] = Counter()

    def next_commit_fault(self) -> str | None:
        if self.unavailable:
            return "unavailable"
        return self.armed.popleft() if self.armed else None


class FaultyTransaction:
    """A real transaction whose commit may fail, before or after being applied."""

    def __init__(self, inner: Any, plan: FaultPlan) -> None:
        self._inner = inner
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self) -> None:
        fault = self._plan.next_commit_fault()
        if fault is not None:
            self._plan.injected[fault] += 1
        if fault == "conflict":
            self._inner.reset()
            raise StoreConflictError("injected conflict (simulation)")
        if fault == "unavailable":
            self._inner.reset()
            raise StoreUnavailableError("injected: store unavailable (simulation)")
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

    def create_transaction(self) -> Any:
        if self._plan.unavailable:
            self._plan.injected["unavailable"] += 1
            raise StoreUnavailableError("injected: store unavailable (simulation)")
        return FaultyTransaction(self._inner.create_transaction(), self._plan)

    def transact(self, fn: Callable[[Any], Any], *, max_retries: int | None = 20) -> Any:
        """Like :meth:`Store.transact`, without sleeping between retries."""
        attempt = 0
        while True:
            txn = self.create_transaction()
            try:
                result = fn(txn)
                txn.commit()
                return result
            except RetryableStoreError:
                txn.reset()
                attempt += 1
                if max_retries is not None and attempt > max_retries:
                    raise
            except BaseException:
                txn.reset()
                raise


# -- worker instances -----------------------------------------------------------------


@dataclass
class MapperInstance:
    """A live mapper object, the address it serves on, and where its window started.

    ``restarting``: its loop must (re)start ingestion before the next step (after split
    brain, or when that restart failed on a store error).
    """

    worker: MapperWorker
    address: str
    started_shuffle: int = 0
    restarting: bool = False


@dataclass
class ReducerInstance:
    """A live reducer object."""

    worker: ReducerWorker


NET_FAULTS = ("ok", "drop_request", "drop_response", "duplicate", "delay_request")

Action = tuple[Any, ...]


class SimNetwork:
    """In-process GetRows: routes a call by address to the instance bound there.

    Before a reducer iteration the simulation sets, for that one call, per-call faults and
    steps to run before the mappers answer and after (stale answers), and whether the calls
    are served in reverse order.
    """

    def __init__(self, sim: Simulation) -> None:
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
            try:
                result = self.serve(call)
                if fault == "duplicate":
                    result = self.serve(call)
            except (ConnectionError, StaleMapperError, CommittedIndexError) as exc:
                results[i] = exc
                continue
            if fault != "drop_response":
                results[i] = result
        self.sim.run_nested(after)
        return results

    def serve(self, call: GetRowsCall) -> GetRowsResult:
        inst = self.sim.bound.get(call.address)
        if inst is None:
            raise ConnectionError(f"nothing listens on {call.address} (sim)")
        n, last, ipc = inst.worker.handle_get_rows(
            call.reducer_index,
            call.committed_row_index,
            call.max_rows,
            call.max_bytes,
            call.mapper_guid,
        )
        return GetRowsResult(n, last, ipc)

    def deliver_late(self) -> None:
        """A delayed request finally reaches its mapper; nobody waits for the answer."""
        if not self.late:
            return
        call = self.late.popleft()
        if call.mapper_index in self.unreachable:
            return
        with contextlib.suppress(ConnectionError, StaleMapperError, CommittedIndexError):
            self.serve(call)

    def close(self) -> None:
        pass


# -- the oracle --------------------------------------------------------------------------


class Oracle:
    """The rows every mapper must produce, in shuffle order."""

    def __init__(self, totals: list[int], num_reducers: int) -> None:
        self.num_reducers = num_reducers
        # outputs[m][s] = (row, copy, reducer) of shuffle index s
        self.outputs: list[list[tuple[int, int, int]]] = []
        # shuffle_at[m][i] = shuffle index of the first output of input row i
        self.shuffle_at: list[list[int]] = []
        for m, total in enumerate(totals):
            outs: list[tuple[int, int, int]] = []
            starts = []
            for row in range(total):
                starts.append(len(outs))
                for copy in range(fanout(m, row)):
                    outs.append((row, copy, reducer_of(m, row, copy, num_reducers)))
            starts.append(len(outs))
            self.outputs.append(outs)
            self.shuffle_at.append(starts)

    def committed_effects(self, states: list[tuple[int, ...]]) -> set[tuple[int, int, int]]:
        """Effects implied by every reducer's committed indices: exactly those rows."""
        out = set()
        for r, committed in enumerate(states):
            for m, last in enumerate(committed):
                for s in range(min(last + 1, len(self.outputs[m]))):
                    row, copy, red = self.outputs[m][s]
                    if red == r:
                        out.add((m, row, copy))
        return out

    def all_effects(self) -> set[tuple[int, int, int]]:
        return {(m, row, copy) for m, outs in enumerate(self.outputs) for row, copy, _ in outs}


# -- the simulation ----------------------------------------------------------------------

CRASH_ERRORS = (InputError, ConnectionError)
"""Errors after which a worker process dies (its loop lets them out) and is restarted."""

STORE_ERRORS = (RetryableStoreError, StoreUnavailableError)
"""Errors a worker's loop notes and retries after a back-off (same instance)."""


class Simulation:
    """M mappers and R reducers of the real worker classes, stepped one step at a time."""

    def __init__(
        self, totals: list[int], num_reducers: int, *, batch_rows: int, commit_max_rows: int
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="millstream-sim-")
        self.partitions = [SimPartition(m, t, visible=t // 2) for m, t in enumerate(totals)]
        self.processor = Processor(
            mapper=SimMapper,
            reducer=SimReducer,
            input=SimInput(self.partitions),
            store=f"sqlite:///{os.path.join(self.dir, 'sim.db')}",
            num_reducers=num_reducers,
            name="sim",
            tuning=ms.Tuning(
                batch_rows=batch_rows,
                memory_limit_bytes=4096,
                commit_max_rows=commit_max_rows,
                get_rows_max_bytes=1 << 20,
            ),
        )
        self.M, self.R = len(totals), num_reducers
        self.raw: Store = open_store(self.processor.store, prefix=(self.processor.name,))
        self.plan = FaultPlan()
        self.store = FaultyStore(self.raw, self.plan)
        self.clock = SimClock()
        self.net = SimNetwork(self)
        self.oracle = Oracle(totals, num_reducers)
        self.mappers: list[list[MapperInstance]] = [[] for _ in range(self.M)]
        self.reducers: list[list[ReducerInstance]] = [[] for _ in range(self.R)]
        self.bound: dict[str, MapperInstance] = {}
        self.hosts = 0
        self.max_committed: list[list[int]] = [[-1] * self.M for _ in range(self.R)]
        self.events: Counter[str] = Counter()
        self.nested_depth = 0
        for m in range(self.M):
            self.start_mapper(m)
        for r in range(self.R):
            self.start_reducer(r)

    def close(self) -> None:
        self.raw.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- lifecycle ------------------------------------------------------------------

    def start_mapper(self, m: int, address: str | None = None) -> None:
        """A new mapper instance (new GUID) serving at ``address`` (default: a new host)."""
        if address is None:
            self.hosts += 1
            address = f"host{self.hosts}:mapper{m}"
        worker = MapperWorker(
            self.processor, m, self.store, clock=self.clock, reader=SimReader(self.partitions[m])
        )
        inst = MapperInstance(worker, address, restarting=True)
        self._mapper_step(inst, lambda: None)
        self.mappers[m].append(inst)
        self.bound[address] = inst
        self.heartbeat(inst)

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
        """Refresh discovery: this instance becomes the freshest of its index."""
        self.clock.advance(0.001)
        w = inst.worker
        txn = self.raw.create_transaction()
        register_worker(txn, "mapper", w.index, w.guid, inst.address, self.clock.wall())
        txn.commit()

    def start_reducer(self, r: int, *, duplicate: bool = False) -> None:
        worker = ReducerWorker(self.processor, r, self.store, self.net, clock=self.clock)
        if not duplicate:
            self.reducers[r].clear()
        self.reducers[r].append(ReducerInstance(worker))

    # -- protocol steps -------------------------------------------------------------

    def _mapper(self, m: int, k: int) -> MapperInstance | None:
        insts = self.mappers[m]
        return insts[k % len(insts)] if insts else None

    def _mapper_step(self, inst: MapperInstance, step: Callable[[], object]) -> None:
        """One step of the mapper's loop, with the loop's error handling."""
        try:
            if inst.restarting:
                inst.worker.start_ingestion()
                assert inst.worker.window is not None
                inst.started_shuffle = inst.worker.window.local_state()[1]
                inst.restarting = False
            step()
        except SplitBrainError:
            # The loop waits, drops the window and restarts ingestion (thesis 4.3.3 step 3).
            self.events["mapper_split_brain"] += 1
            inst.restarting = True
        except STORE_ERRORS:
            self.events["mapper_store_error"] += 1
        except CRASH_ERRORS:
            self.events["mapper_crashed"] += 1
            self._kill(inst)

    def _kill(self, inst: MapperInstance) -> None:
        m = inst.worker.index
        if inst in self.mappers[m]:
            self.mappers[m].remove(inst)
        if self.bound.get(inst.address) is inst:
            del self.bound[inst.address]

    def ingest(self, m: int, k: int) -> None:
        inst = self._mapper(m, k)
        if inst is None:
            return
        window = inst.worker.window
        if window is not None and not inst.restarting and not window.wait_for_room(0):
            self.events["mapper_window_full"] += 1
            return
        self._mapper_step(inst, inst.worker.ingest_once)

    def trim(self, m: int, k: int) -> None:
        inst = self._mapper(m, k)
        if inst is not None:
            self._mapper_step(inst, inst.worker.trim_input_rows)

    def reduce(
        self,
        r: int,
        k: int,
        faults: Sequence[str] = (),
        before: Sequence[Action] = (),
        after: Sequence[Action] = (),
        reverse: bool = False,
    ) -> None:
        insts = self.reducers[r]
        if not insts:
            return
        inst = insts[k % len(insts)]
        self.net.faults, self.net.before, self.net.after = faults, before, after
        self.net.reverse = reverse
        self.nested_depth += 1
        try:
            if inst.worker.run_once():
                self.events["reducer_commit"] += 1
        except STORE_ERRORS:
            self.events["reducer_store_error"] += 1
        finally:
            self.nested_depth -= 1
            self.net.faults, self.net.before, self.net.after = (), (), ()

    def run_nested(self, actions: Sequence[Action]) -> None:
        """Steps that happen while a reducer waits on the network."""
        for action in actions:
            self.do(action)

    def do(self, action: Action) -> None:
        """One step named by a tuple (used for steps nested inside a reducer iteration)."""
        kind, *args = action
        if kind == "ingest":
            self.ingest(args[0] % self.M, args[1])
        elif kind == "trim":
            self.trim(args[0] % self.M, args[1])
        elif kind == "reduce":
            if self.nested_depth < 2:
                self.reduce(args[0] % self.R, args[1])
        elif kind == "restart_mapper":
            self.restart_mapper(args[0] % self.M, args[1])
        elif kind == "crash_mapper":
            self.crash_mapper(args[0] % self.M, args[1])
        elif kind == "commit_fault":
            self.plan.armed.append(args[0])
        elif kind == "deliver_late":
            self.net.deliver_late()
        elif kind == "heartbeat":
            inst = self._mapper(args[0] % self.M, args[1])
            if inst is not None:
                self.heartbeat(inst)
        else:
            raise ValueError(f"unknown action {action!r}")

    # -- observation ----------------------------------------------------------------

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

    def check(self) -> None:
        """Every safety invariant; raises AssertionError with what broke."""
        states, mstates, effects = self.read_store()
        twice = {k: v for k, v in effects.items() if v != 1}
        assert not twice, f"effects applied other than once: {sorted(twice.items())[:10]}"
        # Committed indices never go backwards.
        for r, committed in enumerate(states):
            for m, c in enumerate(committed):
                assert c >= self.max_committed[r][m], (
                    f"reducer {r}'s committed index for mapper {m} went back from "
                    f"{self.max_committed[r][m]} to {c}"
                )
                self.max_committed[r][m] = c
        # The effects are exactly the rows the committed indices name.
        want = self.oracle.committed_effects(states)
        have = set(effects)
        assert have == want, (
            f"effects differ from the committed indices {states}: missing "
            f"{sorted(want - have)[:10]}, unexpected {sorted(have - want)[:10]}"
        )
        for m, ps in enumerate(mstates):
            starts = self.oracle.shuffle_at[m]
            i = ps.input_unread_row_index
            assert 0 <= i < len(starts), f"mapper {m} persisted input index {i} out of range"
            assert ps.shuffle_unread_row_index == starts[i], (
                f"mapper {m} persisted state {ps} pairs input {i} with the wrong shuffle "
                f"index (want {starts[i]})"
            )
            not_done = [(m, row, copy) for row, copy, _ in self.oracle.outputs[m][: starts[i]]]
            missing = [e for e in not_done if e not in have]
            assert not missing, (
                f"mapper {m}'s persisted state {ps} passed rows whose effect is not "
                f"committed: {missing[:10]}"
            )
            t = self.partitions[m].trimmed
            early = [
                (m, row, copy)
                for row, copy, _ in self.oracle.outputs[m][: starts[min(t, len(starts) - 1)]]
                if (m, row, copy) not in have
            ]
            assert not early, f"partition {m} trimmed to {t} before effects {early[:10]}"
            assert t <= i, f"partition {m} trimmed to {t} past its persisted state {ps}"
        for m, insts in enumerate(self.mappers):
            for inst in insts:
                self._check_window(m, inst, states)

    def _check_window(self, m: int, inst: MapperInstance, states: list[tuple[int, ...]]) -> None:
        w = inst.worker.window
        if w is None:
            return
        input_unread, shuffle_unread, _ = w.local_state()
        end = w.shuffle_end_row_index
        who = f"mapper {m} instance {inst.worker.guid[:8]}"
        # Rows at or below a reducer's committed index are dropped on push, so the entries
        # hold at most the rows of their shuffle range and at least the buffered ones.
        assert w.buffered_rows <= end - shuffle_unread, (
            f"{who}: buffered_rows {w.buffered_rows} but the window spans shuffle rows "
            f"[{shuffle_unread}, {end})"
        )
        pending_total = sum(w.bucket_len(r) for r in range(self.R))
        assert pending_total <= w.buffered_rows, (
            f"{who}: buckets hold {pending_total} rows but the window {w.buffered_rows}"
        )
        if w.num_entries == 0:
            assert w.buffered_rows == 0, f"{who}: no entries but {w.buffered_rows} rows"
            assert w.buffered_bytes == 0, f"{who}: no entries but {w.buffered_bytes} bytes"
        counts = w.bucket_pointer_counts()
        assert len(counts) == w.num_entries, f"{who}: {len(counts)} counts, {w.num_entries}"
        nonempty = sum(1 for r in range(self.R) if w.bucket_len(r))
        assert sum(counts) == nonempty, (
            f"{who}: bucket pointer counts {counts} but {nonempty} non-empty buckets"
        )
        starts = self.oracle.shuffle_at[m]
        if input_unread < len(starts):
            assert shuffle_unread == starts[input_unread], (
                f"{who}: local state pairs input {input_unread} with shuffle {shuffle_unread}"
            )
        outs = self.oracle.outputs[m]
        for r in range(self.R):
            pending = w.pending_shuffle_indices(r)
            assert len(pending) == w.bucket_len(r), f"{who}: bucket {r} length mismatch"
            assert all(a < b for a, b in itertools.pairwise(pending))
            for s in pending:
                assert shuffle_unread <= s < end, f"{who}: bucket {r} holds row {s} out of range"
                assert outs[s][2] == r, (
                    f"{who}: bucket {r} holds shuffle row {s} that is not reducer {r}'s"
                )
            committed = states[r][m]
            lost = [
                s
                for s in range(max(inst.started_shuffle, committed + 1), min(end, len(outs)))
                if outs[s][2] == r and s not in pending
            ]
            assert not lost, (
                f"{who}: bucket {r} lost uncommitted shuffle rows {lost[:10]} "
                f"(reducer {r} committed {committed})"
            )

    # -- the end ----------------------------------------------------------------------

    def heal(self) -> None:
        """Faults off, every partition fully produced, one live instance per worker."""
        self.plan.armed.clear()
        self.plan.unavailable = False
        self.net.unreachable.clear()
        self.net.late.clear()
        for p in self.partitions:
            p.unavailable = False
            p.visible = p.total
        for m in range(self.M):
            for inst in list(self.mappers[m]):
                self._kill(inst)
            self.start_mapper(m)
        for r in range(self.R):
            self.start_reducer(r)

    def drain(self, rounds: int = 400) -> None:
        """Run every worker with faults off until every row's effect is committed."""
        self.heal()
        everything = self.oracle.all_effects()
        for _ in range(rounds):
            for m in range(self.M):
                self.ingest(m, 0)
            for r in range(self.R):
                self.reduce(r, 0)
            for m in range(self.M):
                self.trim(m, 0)
            self.check()
            _, _, effects = self.read_store()
            if set(effects) == everything and all(
                self.mappers[m] and self.mappers[m][0].worker.is_drained() for m in range(self.M)
            ):
                break
        _, mstates, effects = self.read_store()
        missing = everything - set(effects)
        assert not missing, f"after draining, effects never applied: {sorted(missing)[:10]}"
        assert all(v == 1 for v in effects.values())
        for m in range(self.M):
            worker = self.mappers[m][0].worker
            assert worker.is_drained(), f"mapper {m} did not drain: {worker.metrics()}"
            worker.mark_drained()
            assert mstates[m].input_unread_row_index == self.partitions[m].total
            assert self.partitions[m].trimmed == self.partitions[m].total
        for r in range(self.R):
            inst = self.reducers[r][0]
            assert not inst.worker.run_once()
            assert inst.worker.all_drained, f"reducer {r} does not see every mapper drained"


def describe(err: BaseException) -> str:
    """One line for a caught error (used in events)."""
    return f"{type(err).__name__}: {err}"


__all__ = [
    "COMMIT_FAULTS",
    "NET_FAULTS",
    "MillstreamError",
    "Simulation",
    "describe",
]
