"""A processor whose workers each run on a host of a
:class:`~tests.support.hosts.cluster.Cluster`, over mutual TLS: mappers on the first hosts,
reducers on the next ones (a duplicate instance, for split brain, on a host of its own
after them)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import millstream as ms
import pyarrow as pa
from millstream.ledger import RunSummary
from millstream.ledger.discovery import list_workers
from millstream.ledger.reducer import read_reducer_state
from millstream.runner.local import LocalRunner
from millstream.runner.placement import WorkerHost

from tests.support.hosts.cluster import Cluster
from tests.support.jobs import KeyedSumMapper
from tests.support.tls_files import SERVER_NAME, make_certificates


def with_tls(tuning: ms.Tuning, directory: Path) -> ms.Tuning:
    """``tuning`` with mutual TLS on GetRows (one CA, one worker certificate)."""
    files = make_certificates(directory)
    return dataclasses.replace(
        tuning,
        tls_ca_file=str(files["ca"]),
        tls_cert_file=str(files["cert"]),
        tls_key_file=str(files["key"]),
        tls_server_name=SERVER_NAME,
    )


@dataclass(frozen=True)
class Layout:
    """Which host each worker runs on: mapper ``m`` on host ``m``, reducer ``r`` on host
    ``num_mappers + r``, extra instances (``(role, index, instance)``) after them."""

    num_mappers: int
    num_reducers: int
    duplicates: tuple[tuple[str, int], ...] = ()
    hosts: dict[tuple[str, int] | tuple[str, int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for m in range(self.num_mappers):
            self.hosts[("mapper", m)] = m
        for r in range(self.num_reducers):
            self.hosts[("reducer", r)] = self.num_mappers + r
        for i, (role, index) in enumerate(self.duplicates):
            self.hosts[(role, index, 1)] = self.num_mappers + self.num_reducers + i

    @property
    def size(self) -> int:
        """Hosts the layout needs."""
        return self.num_mappers + self.num_reducers + len(self.duplicates)

    def mapper_hosts(self) -> list[int]:
        return list(range(self.num_mappers))

    def reducer_hosts(self) -> list[int]:
        return [self.num_mappers + r for r in range(self.num_reducers)]

    def placement(
        self, cluster: Cluster
    ) -> Mapping[tuple[str, int] | tuple[str, int, int], WorkerHost]:
        """The runner's ``hosts`` argument for ``cluster``."""
        return {
            wid: WorkerHost(cluster.hosts[h].address, cluster.hosts[h].netns)
            for wid, h in self.hosts.items()
        }


def hosted_runner(processor: ms.Processor, layout: Layout, cluster: Cluster) -> LocalRunner:
    """A local runner that starts each worker on its host of ``cluster``."""
    instances = {d: 2 for d in layout.duplicates}
    return LocalRunner(processor, hosts=layout.placement(cluster), instances=instances)


def advertised(processor: ms.Processor) -> dict[int, str]:
    """The address each registered mapper advertises now (discovery), by mapper index."""
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        try:
            return {w.index: w.address for w in list_workers(txn, "mapper")}
        finally:
            txn.reset()
    finally:
        store.close()


class GatedKeyedSumMapper(KeyedSumMapper):
    """:class:`KeyedSumMapper` that sleeps ``config["map_seconds"]`` per batch while the
    file ``config["gate"]`` exists: the stream lasts as long as the faults injected while
    it runs, and drains at full speed once the gate is removed (the rows mapped do not
    depend on it)."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        if os.path.exists(str(self.config["gate"])):
            time.sleep(float(self.config.get("map_seconds", 0.1)))
        return super().map(batch)


def committed(processor: ms.Processor) -> list[tuple[int, ...]]:
    """Each reducer's committed shuffle index per mapper (its persisted state), now."""
    store = processor.open_store()
    try:
        txn = store.create_transaction()
        try:
            return [
                read_reducer_state(
                    txn, r, processor.num_mappers, snapshot=True
                ).committed_row_indices
                for r in range(processor.num_reducers)
            ]
        finally:
            txn.reset()
    finally:
        store.close()


def run_until(runner: LocalRunner, condition: Callable[[], bool], what: str) -> None:
    """Keep ``runner`` going (restarts) until ``condition()``; fail naming ``what`` if that
    takes more than :data:`PATIENCE_SECONDS`."""
    give_up = time.monotonic() + PATIENCE_SECONDS
    while not condition():
        assert not runner.poll(), f"the run drained before {what}"
        assert time.monotonic() < give_up, f"not {what} within {PATIENCE_SECONDS:.0f}s"
        time.sleep(0.05)


PATIENCE_SECONDS = 120.0
"""How long :func:`run_until` waits: a bound that only a hung run reaches, not a timing."""


def drain(runner: LocalRunner) -> RunSummary:
    """Keep ``runner`` going until the run drained (at most :data:`PATIENCE_SECONDS`)."""
    give_up = time.monotonic() + PATIENCE_SECONDS
    while not runner.poll():
        assert time.monotonic() < give_up, f"not drained within {PATIENCE_SECONDS:.0f}s"
        time.sleep(0.05)
    return runner.finish()


class GatedPaneMapper(ms.event_time.PaneMapper):
    """:class:`~millstream.event_time.PaneMapper` slowed while ``config["gate"]`` exists
    (as :class:`GatedKeyedSumMapper`)."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        if os.path.exists(str(self.config["gate"])):
            time.sleep(float(self.config.get("map_seconds", 0.1)))
        return super().map(batch)
