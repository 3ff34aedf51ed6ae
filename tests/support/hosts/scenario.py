"""One seed of the nemesis: a job on hosts of their own, cut apart while it runs, checked
exact once it drained.

Jobs: ``keyed_sum`` (the CI test's), ``panes`` (tumbling event-time panes into a
Parquet sink) and ``pipeline`` (a keyed sum whose reducers append partial sums to a store
queue, read by a second processor: the queue reducer's path). Every job's mappers are
slowed while the nemesis runs (a gate file) and run at full speed once it healed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import millstream as ms
from millstream.inputs import StoreQueue
from millstream.outputs import ParquetSink
from millstream.runner.forkserver import start_fork_server
from millstream.runner.local import LocalRunner

from tests.support.hosts.cluster import Cluster, inside, start_foundationdb
from tests.support.hosts.hosted import GatedKeyedSumMapper, GatedPaneMapper, Layout, with_tls
from tests.support.hosts.nemesis import CUTS, STORE_CUT, Nemesis, plan
from tests.support.jobs import (
    EVENT_DISORDER_MS,
    EVENT_PANES,
    KeyedSumReducer,
    PassThroughMapper,
    SumsToQueueReducer,
    expected_panes,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_event_input,
    write_keyed_input,
    written_panes,
)

DRAIN_SECONDS = 60.0
"""The run must drain within this long after the nemesis's final heal: a GetRows call
stuck on a connection that a cut left half-open would hold it longer."""

JOBS = ("keyed_sum", "panes", "pipeline")

MAP_SECONDS = 0.2
"""A mapper's pause per batch of 1,000 rows while the nemesis runs: 5,000 rows a second."""

_BATCH_ROWS = 1_000


@dataclass
class Job:
    """The processors of one job (the stages of a pipeline, in order) and its check."""

    processors: list[ms.Processor]
    check: Callable[[], None]
    rows: int


def _tune(directory: Path) -> ms.Tuning:
    tune = tuning(batch_rows=_BATCH_ROWS, restart=ms.RestartStrategy(max_restarts=100))
    return with_tls(tune, directory / "tls")


def keyed_sum(directory: Path, seed: int, gate: Path, rows: int) -> Job:
    """Sums per key; exact against pyarrow's group-by."""
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000, seed=seed)
    processor = keyed_processor(
        data,
        directory / "state.db",
        tune=_tune(directory),
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": MAP_SECONDS},
    )

    job = Job([processor], lambda: None, rows)

    def check() -> None:  # the processor may have moved to another store
        assert read_output(job.processors[0], "sum") == expected_sums(data), "sums differ"

    job.check = check
    return job


def panes(directory: Path, seed: int, gate: Path, rows: int) -> Job:
    """Tumbling one-minute panes into a Parquet sink; exact against pyarrow, none late."""
    data = write_event_input(directory / "in", rows, disorder_ms=EVENT_DISORDER_MS, seed=seed)
    state = directory / "state.db"
    sink = ParquetSink(f"sqlite:///{state}", "per-minute", str(directory / "out"))
    processor = ms.Processor(
        mapper=GatedPaneMapper,
        reducer=ms.event_time.PaneReducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=f"sqlite:///{state}",
        num_reducers=2,
        config={"panes": EVENT_PANES, "gate": str(gate), "map_seconds": MAP_SECONDS},
        outputs=[sink],
        tuning=_tune(directory),
    )

    def check() -> None:
        assert ms.event_time.late_rows(processor) == 0, "rows dropped as late"
        assert written_panes(sink) == expected_panes(data), "panes differ"

    return Job([processor], check, rows)


def pipeline(directory: Path, seed: int, gate: Path, rows: int) -> Job:
    """Partial sums through a store queue into a second keyed sum; exact end to end."""
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000, seed=seed)
    state = directory / "state.db"
    partials = StoreQueue(f"sqlite:///{state}", "partials", 2)
    tune = _tune(directory)
    first = keyed_processor(
        data,
        state,
        mapper=GatedKeyedSumMapper,
        reducer=SumsToQueueReducer,
        name="first",
        config={"queue": "partials", "gate": str(gate), "map_seconds": MAP_SECONDS},
        tune=tune,
    )
    first = ms.Processor(**{**first.__dict__, "outputs": [partials]})
    second = ms.Processor(
        mapper=PassThroughMapper,
        reducer=KeyedSumReducer,
        input=partials,
        store=first.store,
        num_reducers=2,
        name="second",
        tuning=tune,
    )

    def check() -> None:
        assert read_output(second, "sum") == expected_sums(data), "sums differ"

    return Job([first, second], check, rows)


BUILDERS: dict[str, Callable[[Path, int, Path, int], Job]] = {
    "keyed_sum": keyed_sum,
    "panes": panes,
    "pipeline": pipeline,
}


@dataclass
class SeedResult:
    """What one seed did: the cuts (all landed), restarts, and the drain after the heal."""

    job: str
    seed: int
    cuts: str
    restarts: int
    rows: int
    seconds_to_drain_after_heal: float

    def __str__(self) -> str:
        return (
            f"{self.job} seed {self.seed}: {self.rows} rows exact, {self.restarts} restarts, "
            f"drained {self.seconds_to_drain_after_heal:.1f}s after the final heal; "
            f"cuts: {self.cuts}"
        )


def run_seed(
    job: str,
    seed: int,
    directory: Path,
    *,
    rows: int = 200_000,
    kinds: tuple[str, ...] = CUTS,
    holds: tuple[float, float] = (1.0, 6.0),
    store: str = "sqlite",
) -> SeedResult:
    """Run ``job`` under the nemesis of ``seed``.

    ``store="fdb"`` (the keyed sum only): the store is FoundationDB on a host of its own and
    the runner on another (the driver's), and the nemesis also cuts a worker from the store.

    Raises:
        AssertionError: A cut did not land, the run did not drain within
            :data:`DRAIN_SECONDS` of the final heal, or the output is not exact.
    """
    layout = Layout(num_mappers=2, num_reducers=2)
    if store == "fdb":
        assert job == "keyed_sum", "only the keyed sum runs on FoundationDB here"
        kinds = (*kinds, STORE_CUT)
    cuts = plan(seed, layout, kinds, holds)
    # Enough rows that the slowed mappers are still at work when the last cut heals
    # (half as many again as they map while the plan lasts, if nothing held them up).
    planned = sum(c.delay + c.hold for c in cuts)
    rate = layout.num_mappers * _BATCH_ROWS / MAP_SECONDS
    rows = max(rows, round(1.5 * planned * rate / 1_000) * 1_000)
    gate = directory / "gate"
    gate.touch()
    built = BUILDERS[job](directory, seed, gate, rows)
    first = built.processors[0]
    assert (first.num_mappers, first.num_reducers) == (layout.num_mappers, layout.num_reducers)
    extra = 2 if store == "fdb" else 0  # the driver's host, the store's host
    with Cluster(layout.size + extra) as cluster, contextlib.ExitStack() as stack:
        store_host = None
        if store == "fdb":
            driver, store_host = layout.size, layout.size + 1
            fdb = start_foundationdb(cluster.hosts[store_host], directory / "fdb")
            stack.callback(fdb.stop)
            built.processors = [
                ms.Processor(**{**p.__dict__, "store": fdb.url}) for p in built.processors
            ]
            start_fork_server(built.processors[0])  # in this host's network: workers move
            stack.enter_context(inside(cluster.hosts[driver]))
        hosts = layout.placement(cluster)
        runners = [LocalRunner(p, hosts=hosts, label=True) for p in built.processors]
        for runner in runners:
            runner.start()
        summaries: list[ms.RunSummary | None] = [None] * len(runners)
        try:
            with Nemesis(cluster, runners, layout, cuts, store_host) as nemesis:
                while any(s is None for s in summaries):
                    for i, runner in enumerate(runners):
                        if summaries[i] is None and runner.poll():
                            summaries[i] = runner.finish()
                    if nemesis.healed_at is not None:
                        gate.unlink(missing_ok=True)
                        waited = time.monotonic() - nemesis.healed_at
                        assert waited < DRAIN_SECONDS, (
                            f"{job} seed {seed}: not drained {DRAIN_SECONDS:.0f}s after the "
                            f"final heal; cuts: {nemesis.report()}"
                        )
                    time.sleep(0.05)
                nemesis.drained()
            drained = time.monotonic() - (nemesis.healed_at or time.monotonic())
        except BaseException:
            for runner in runners:
                runner.stop()
            raise
        built.check()  # exact first (inside: the store may be on a host of its own)
    nemesis.check()
    assert summaries[0] is not None
    assert summaries[0].rows_read == rows
    restarts = sum(s.restarts for s in summaries if s is not None)
    return SeedResult(job, seed, nemesis.report(), restarts, rows, drained)
