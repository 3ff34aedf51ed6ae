"""A deterministic, in-process simulation of the whole shuffle protocol (thesis 4.3-4.6).

The REAL worker classes run here (:class:`MapperWorker`, :class:`ReducerWorker`), stepped
one protocol step at a time by the test, against:

- a real SQLite store in a temporary file (``synchronous=normal``: commits stay atomic and
  survive a process crash; only power loss is out of scope), wrapped by
  :class:`~tests.support.simulation.faults.FaultyStore`, and
  :class:`~tests.support.simulation.faults.SimNetwork` for GetRows (the faults module says
  what fails and how);
- :class:`~tests.support.simulation.model.SimInput`, an in-memory replayable input whose
  partitions grow, can be unavailable, can be slow (other steps run while a read waits),
  and, like a real queue, forget trimmed rows (a read below the trim point raises
  :class:`~tests.support.simulation.model.TrimmedInputError`, as
  :class:`~millstream.inputs.StoreQueue` does);
- a :class:`~millstream.testing.ManualClock`, time that moves only when the simulation
  says so; the store's transaction-age check reads it too;
- :class:`~tests.support.simulation.producer.SimProducer`, a producer appending to a real
  store queue in the faulty store, whose every appended row must be in the queue exactly
  once.

This module holds :class:`Simulation`'s life cycle, its protocol steps and the steps by
name (:meth:`Simulation.do`); its composite steps are in ``steps.py``, its invariants in
``checks.py``, the job and its oracle in ``model.py``.

There are no threads, no wall-clock reads and no random numbers: worker GUIDs are
sequential and one sequence of steps (:attr:`Simulation.steps`) always replays the same way
(:func:`replay`). The simulation records a trace of what every step did.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import millstream as ms
from millstream.exceptions import (
    MapperSupersededError,
    SplitBrainError,
    TransactionTooLargeError,
)
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import register_worker, unregister_worker
from millstream.processor import Processor
from millstream.state import Store, open_store
from millstream.testing import ManualClock
from millstream.workers import MapperWorker, ReducerWorker

from tests.support.simulation.checks import Invariants
from tests.support.simulation.faults import (
    CRASH_ERRORS,
    STORE_ERRORS,
    FaultPlan,
    FaultyStore,
    SimNetwork,
)
from tests.support.simulation.instances import MapperInstance, ReducerInstance, WindowProbe
from tests.support.simulation.model import (
    EMITTED,
    SIM_START,
    SIM_WALL_OFFSET,
    Oracle,
    SimInput,
    SimMapper,
    SimPartition,
    SimQueueReducer,
    SimReader,
    SimReducer,
    TrimmedInputError,
)
from tests.support.simulation.producer import QUEUE_PARTITIONS, SimProducer
from tests.support.simulation.steps import Action, CompositeSteps


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


class Simulation(CompositeSteps, Invariants):
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
            "from tests.support.simulation import SimConfig, replay\n"
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
