"""A producer appending to a real store queue in the faulty store: every row it appended
must be in the queue exactly once."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow as pa
from millstream.inputs.queue_producer import QueueProducer
from millstream.inputs.store_queue import StoreQueue

from tests.support.simulation.faults import STORE_ERRORS

if TYPE_CHECKING:
    from tests.support.simulation.simulation import Simulation

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
