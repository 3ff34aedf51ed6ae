"""A reducer whose outputs go through a store with faults injected at the Store API.

The store underneath is the real SQLite store; the simulation's :class:`FaultyStore`
makes the commits and reads the test arms fail, for the reducer and for its outputs
(queue and sink), as an outage of the store would. Mappers use the store directly.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pyarrow.dataset as pads
from millstream.inputs import StoreQueue
from millstream.ledger import OUTPUT
from millstream.outputs import STAGING, ParquetSink
from millstream.state import open_store
from millstream.testing import InProcessTransport
from millstream.workers import ManualClock, ReducerWorker

from tests.support.simulation.faults import FaultPlan, FaultyStore
from tests.support.worker_fixtures import Cluster

SINK = "files"
QUEUE = "emitted"

KINDS = ("store", "queue", "parquet")
"""The kinds of output a round may emit: a store write, a queue append, a Parquet file."""


class PlannedOutputs(ms.QueueReducer):
    """Each ``process`` emits one new token to the outputs ``plan`` names, and finishes
    every pending row or none (every row once every mapper ended).

    Shared on purpose, set by the test: ``plan``, the output kinds (a subset of
    :data:`KINDS`) and whether to finish the pending rows; ``emitted``, per call, its
    token, kinds and whether it finished rows.
    """

    plan: tuple[frozenset[str], bool] = (frozenset(), False)
    emitted: list[tuple[str, frozenset[str], bool]] = []  # noqa: RUF012

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        kinds, finish = PlannedOutputs.plan
        finish = finish or len(pending.ended_partitions) == self.spec.num_partitions
        token = uuid.uuid4().hex
        one = pa.table({"token": [token]})
        if "store" in kinds:
            txn.set(("emitted", token), b"")
        if "queue" in kinds:
            txn.append(QUEUE, one)
        if "parquet" in kinds:
            txn.write_parquet(SINK, one)
        if finish:
            pending.finish_all()
            txn.add(("rows", 0), len(pending))
        PlannedOutputs.emitted.append((token, kinds, finish))


class Rig:
    """One reducer (index 0) on a store with injected faults, its mappers, a Parquet sink
    and an output queue, stepped by the test."""

    def __init__(
        self,
        tmp_path: Path,
        tables: list[pa.Table],
        reducer: type[ms.Reducer],
        config: dict[str, Any] | None = None,
    ) -> None:
        self.notes: list[str] = []
        self.plan = FaultPlan(ManualClock(), self.notes.append)
        url = f"sqlite:///{tmp_path / 'state.db'}"
        self._outputs_store = open_store(url)
        faulty = FaultyStore(self._outputs_store, self.plan)
        self.directory = tmp_path / "out"
        self.sink = ParquetSink(faulty, SINK, str(self.directory))  # type: ignore[arg-type]
        self.queue = StoreQueue(faulty, QUEUE, 1)  # type: ignore[arg-type]
        self.cluster = Cluster(
            tmp_path,
            tables,
            num_reducers=1,
            reducer=reducer,
            config=config,
            outputs=[self.sink, self.queue],
        )
        self.plan.clock = self.cluster.clock
        self.store = FaultyStore(self.cluster.store, self.plan)
        self.reducer = self.restart()

    def restart(self) -> ReducerWorker:
        """A new instance of the reducer (the old one is gone, with what it held)."""
        c = self.cluster
        self.reducer = ReducerWorker(
            c.processor,
            0,
            self.store,  # type: ignore[arg-type]
            InProcessTransport(c.handlers),
            clock=c.clock,
        )
        c.reducers[0] = self.reducer
        return self.reducer

    def ingest(self) -> None:
        """Every mapper reads and maps its next batch."""
        for mapper in self.cluster.mappers.values():
            if not mapper.end_of_input:
                mapper.ingest_once()

    def trim(self) -> None:
        for mapper in self.cluster.mappers.values():
            mapper.trim_input_rows()

    def drained(self) -> bool:
        return all(m.is_drained() for m in self.cluster.mappers.values())

    def run_to_end(self, limit: int = 200) -> None:
        """Rounds without faults until every mapper drained (not the reducer's drain)."""
        self.plan.armed.clear()
        for _ in range(limit):
            self.ingest()
            self.reducer.run_once()
            self.trim()
            if self.drained():
                for mapper in self.cluster.mappers.values():
                    mapper.mark_drained()
                return
        raise AssertionError("the processor did not drain")

    def run_loop(self) -> None:
        """The reducer's own loop (:meth:`ReducerWorker.run`), on the manual clock."""
        self.reducer.run(threading.Event())

    # -- what landed --------------------------------------------------------------------

    def published(self) -> list[str]:
        """Tokens in the sink's directory as a plain reader sees it (published files)."""
        files = [p for p in self.directory.glob("*.parquet")]
        if not files:
            return []
        table = pads.dataset([str(p) for p in files], format="parquet").to_table()
        return [str(t) for t in table["token"].to_pylist()]

    def staged(self) -> list[str]:
        return sorted(p.name for p in (self.directory / STAGING).iterdir())

    def queued(self) -> list[str]:
        """Tokens appended to the output queue."""
        reader = StoreQueue(self._outputs_store, QUEUE, 1)
        got: list[str] = []
        while (part := reader.read(0, len(got), 1_000).batch) is not None:
            got.extend(str(t) for t in part.column("token").to_pylist())
        return got

    def stored(self, keyspace: str) -> dict[Any, bytes]:
        with self.cluster.store.read() as txn:
            rows = txn.get_range_startswith((*OUTPUT, keyspace))
        return {key[-1]: value for key, value in rows}

    def close(self) -> None:
        self.cluster.store.close()
        self._outputs_store.close()


def rig(tmp_path: Path, *args: Any, **kwargs: Any) -> Iterator[Rig]:
    """A :class:`Rig` closed after the test (for fixtures)."""
    r = Rig(tmp_path, *args, **kwargs)
    try:
        yield r
    finally:
        r.close()
