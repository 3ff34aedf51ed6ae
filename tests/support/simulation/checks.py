"""The simulation's invariants, checked after every step: effects exactly once (or at
least once), committed indices never going back, persisted states and trim points at
batch boundaries and behind committed effects, spilled rows, the output queue, every
window's accounting and buckets, and the producer's queue.

:class:`Invariants` is part of :class:`~tests.support.simulation.simulation.Simulation`
(it reads the simulation's store, oracle and instances).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.ipc
from millstream._core import SHUFFLE_INDEX_COLUMN
from millstream.ledger import read_mapper_state, read_reducer_state
from millstream.ledger.spill import spill_pending
from millstream.ledger.subspaces import SYSTEM

from tests.support.simulation.instances import MapperInstance, WindowProbe
from tests.support.simulation.model import COPIES, EFFECT, effects_of_rows


class Invariants:
    """Observation and invariants of :class:`~tests.support.simulation.simulation.Simulation`."""

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
