"""The simulation's composite steps: sequences of protocol steps aimed at one race (split
brain, a duplicate reading behind a trim, racing reducers, reused addresses), a restart
mid-stream, queue appends, time passing, a rescale and partitions moving between workers.

:class:`CompositeSteps` is part of :class:`~tests.support.simulation.simulation.Simulation`
(its protocol steps, its checks and its state are the simulation's).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from typing import Any

import millstream as ms
from millstream.exceptions import CommittedIndexError, StaleMapperError
from millstream.ledger import (
    RescalePlan,
    check_processor_info,
    freshest_workers,
    list_workers,
    reducer_state_key,
)
from millstream.ledger.rescale import begin_rescale, finish_rescale

from tests.support.simulation.faults import STORE_ERRORS, CommitHook
from tests.support.simulation.instances import MapperInstance
from tests.support.simulation.producer import SimProducer

Action = tuple[Any, ...]
"""One step, e.g. ``("ingest", mapper, instance)``; see :meth:`Simulation.do`."""


class CompositeSteps:
    """Composite steps of :class:`~tests.support.simulation.simulation.Simulation`."""

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
