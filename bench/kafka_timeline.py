"""When the rows reach the mappers: the keyed sum's two mappers with each ``map`` call's
start, end and rows written to a file (its name in :data:`TIMELINE_ENV`, which workers
inherit), so that :mod:`bench.kafka` can say, for each source, when the mappers got their
first and last rows and how long the run went on after.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import millstream as ms
import pyarrow as pa

from bench.kafka_mapper import KafkaPreAggregate
from examples.keyed_sum import PreAggregate

TIMELINE_ENV = "MILLSTREAM_BENCH_TIMELINE"
"""The file ``map`` calls are written to (one line each: start, end, rows, pid)."""


class TimedMap(ms.Mapper):
    """A mapper mixin that writes each ``map`` call of the mapper after it down."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        started = time.time()
        mapped = super().map(batch)
        _write(started, batch.num_rows)
        return mapped


class TimedKafkaPreAggregate(TimedMap, KafkaPreAggregate):
    """:class:`~bench.kafka_mapper.KafkaPreAggregate`, each ``map`` written down."""


class TimedPreAggregate(TimedMap, PreAggregate):
    """:class:`~examples.keyed_sum.PreAggregate`, each ``map`` written down."""


def _write(started: float, rows: int) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if path:
        with Path(path).open("a") as out:
            out.write(f"{started:.6f} {time.time():.6f} {rows} {os.getpid()}\n")


def summarize(path: Path, run_started: float, run_ended: float) -> dict[str, float]:
    """From a run's file: seconds after the run's start at which the first ``map`` began,
    each mapper's first ``map`` began (the latest of them), the last ``map`` ended, and the
    run ended."""
    calls = [line.split() for line in path.read_text().splitlines()]
    first_by_pid: dict[str, float] = {}
    for start, _, _, pid in calls:
        first_by_pid[pid] = min(first_by_pid.get(pid, float(start)), float(start))
    return {
        "first_rows": min(first_by_pid.values()) - run_started,
        "every_mapper_has_rows": max(first_by_pid.values()) - run_started,
        "last_map_ended": max(float(end) for _, end, _, _ in calls) - run_started,
        "run_ended": run_ended - run_started,
    }
