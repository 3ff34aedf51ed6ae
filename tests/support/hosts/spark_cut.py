"""Cuts while a keyed sum runs on a Spark standalone cluster across hosts
(:mod:`tests.support.hosts.spark_cluster`), each healed before the next: the sums must equal
the input's, and the run must drain within :data:`DRAIN_SECONDS` of the last heal.

Host 0 runs the master and the driver, hosts 1 and 2 a Spark worker each (one executor of
:data:`CORES` task slots: the four millstream workers spread two and two, and either
executor has the slots for all four). The store is SQLite (a file every host shares) or
FoundationDB on host 3. The mappers are slowed (a gate file) until the last heal, then run
at full speed. Each cut falls on the host of a seeded millstream worker, at a seeded moment,
in a seeded order (:data:`CUTS`):

- ``worker_from_driver`` (either store): the host is cut from host 0 only; it still reaches
  the other worker host (GetRows) and the store. The driver hears no heartbeat from its
  executor for ``spark.network.timeout`` (or the master none from its worker for
  ``spark.worker.timeout``), drops it and starts its tasks again on the other host. The new
  instances register under new GUIDs and fence the old ones, which live on behind the cut
  and still reach the store: an old reducer's commit fails its state check (split brain),
  an old mapper's writes of its state fail theirs and it restarts its ingestion, and the
  reducers ask only the newest instance for rows. The cut holds until every worker of the
  host was started again elsewhere, and a seeded while after.
- ``worker_from_store`` (FoundationDB): the host is cut from the store's host only. Spark
  sees nothing wrong (the driver and the master still hear from it), so nothing is moved:
  the workers there stall on the store, every transaction failing after the store's
  timeout (``millstream.state.fdb_backend.DEFAULT_TIMEOUT_MS``) and retried with backoff,
  while their mappers go on serving GetRows from their windows. Reducers on the other host
  keep committing, from both hosts' mappers (a count: :attr:`SparkCut.commits`); those on
  the cut host commit nothing, unless an old instance of theirs, replaced in an earlier
  cut from the driver and not yet killed, still runs on the other host: it then commits
  for them, rightly (its state check passes, since the stalled instance commits nothing;
  :attr:`SparkCut.old_alive_at_cut`). At the heal the stalled instances resume where the
  last commit left them. The cut holds for a seeded time within
  :data:`STORE_HOLD_SECONDS`, past the store's timeout, so that the stalled workers see
  transactions fail.

A cut *lands* when the hosts' own devices report it in place while the run still runs;
:func:`run_spark_cut` fails on a planned cut that did not.
"""

from __future__ import annotations

import contextlib
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import millstream as ms
from millstream.ledger.discovery import WorkerInfo, freshest_workers

from tests.support.hosts.cluster import Cluster, inside, start_foundationdb
from tests.support.hosts.hosted import GatedKeyedSumMapper, committed, with_tls
from tests.support.hosts.spark_cluster import Driver, HostedStandaloneCluster, start_driver
from tests.support.jobs import (
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)
from tests.support.spark_jobs import workers
from tests.support.spark_standalone import executor_address

CORES = 4
"""Task slots per Spark worker: each holds all four millstream workers alone."""

CUTS = {
    "sqlite": ("worker_from_driver",),
    "fdb": ("worker_from_driver", "worker_from_store"),
}
"""The cuts of a run, by store: SQLite is a file every host shares, so it has no host to
cut a worker from."""

DRAIN_SECONDS = 60.0
"""The run must drain within this long after the last heal."""

PATIENCE_SECONDS = 180.0
"""How long a step may take before the scenario gives up: only a hung run reaches it."""

MAP_SECONDS = 0.5
"""A mapper's pause per batch of 1,000 rows until the last heal: 4,000 rows a second."""

STORE_HOLD_SECONDS = (12.0, 18.0)
"""How long a worker host stays cut from the store's host: past the store's 10 s
transaction timeout."""

SPARK_EVENTS = {
    "driver lost an executor": re.compile(r"Lost executor \d+ on"),
    "driver dropped an executor without heartbeats": re.compile(r"with no recent heartbeats"),
    "task lost with its executor": re.compile(r"Lost task .*ExecutorLostFailure"),
    "master dropped a worker without heartbeats": re.compile(
        r"Removing worker-\S+ because we got no heartbeat"
    ),
    "master launched an executor": re.compile(r"Launching executor"),
    "worker asked to kill an executor": re.compile(r"Asked to kill executor"),
    "worker registered with the master": re.compile(r"Successfully registered with master"),
}
"""What Spark did, by the lines of the driver's, the master's and the workers' logs that
say it. The driver loses the cut host's executor either way, by whichever of two timeouts
fires first: its own (no heartbeats for ``spark.network.timeout``: the tasks are lost
"caused by one of the running tasks", which counts against ``spark.task.maxFailures``) or
the master's (no worker heartbeats for ``spark.worker.timeout``: "worker lost", not
counted)."""

WorkerId = tuple[str, int]


@dataclass
class SparkCut:
    """What one cut did."""

    kind: str
    host: str
    """The cut host's address."""
    workers: list[WorkerId]
    """The millstream workers on it when it was cut."""
    landed: bool = False
    held: float = 0.0
    relaunched: list[tuple[str, str, float]] = field(default_factory=list)
    """Its workers Spark started again, the host each went to, and how long after the cut
    (``worker_from_driver``)."""
    replaced: dict[WorkerId, int] = field(default_factory=dict)
    """The pids of the instances started again elsewhere."""
    old_alive_at_heal: int = 0
    """Of the replaced instances, how many were still alive when the cut healed."""
    commits: dict[str, int] = field(default_factory=dict)
    """Shuffle rows committed while the cut held, for the reducers on the cut host and for
    the others, by whichever instance (``worker_from_store``)."""
    old_alive_at_cut: int = 0
    """Instances replaced in earlier cuts still alive when this one was made."""

    def __str__(self) -> str:
        names = ", ".join(f"{r} {i}" for r, i in self.workers)
        text = f"{self.kind}: host {self.host} ({names}) for {self.held:.1f}s"
        if self.relaunched:
            moved = "; ".join(f"{w} to {h} {t:.1f}s after the cut" for w, h, t in self.relaunched)
            text += f", started again: {moved}; old alive at the heal {self.old_alive_at_heal}"
        if self.commits:
            text += ", rows committed meanwhile: " + ", ".join(
                f"{k} {v}" for k, v in self.commits.items()
            )
            text += f"; replaced instances still alive {self.old_alive_at_cut}"
        return text + (" landed" if self.landed else " DID NOT LAND")


@dataclass
class SparkCutResult:
    """What a run did: its cuts, in order, and how it ended."""

    seed: int
    store: str
    cuts: list[SparkCut]
    old_alive_after_drain: int
    """Replaced instances still alive after the drain."""
    restarts: int
    rows: int
    seconds_to_drain_after_heal: float
    spark: dict[str, int]

    def __str__(self) -> str:
        events = ", ".join(f"{k} x{n}" for k, n in self.spark.items() if n)
        cuts = "; ".join(map(str, self.cuts))
        return (
            f"spark on {self.store} seed {self.seed}: {self.rows} rows exact; cuts: {cuts}; "
            f"{self.restarts} failed tasks; replaced instances alive after the drain "
            f"{self.old_alive_after_drain}; drained {self.seconds_to_drain_after_heal:.1f}s "
            f"after the last heal; Spark: {events}"
        )


@dataclass
class _Run:
    """What the cuts act on."""

    network: Cluster
    spark: HostedStandaloneCluster
    processor: ms.Processor
    driver: Driver
    rng: random.Random
    hold: tuple[float, float]
    store_host: int | None
    replaced: list[int] = field(default_factory=list)
    """The pids of every instance replaced so far."""

    def wait(self, condition: Callable[[], bool], what: str) -> None:
        give_up = time.monotonic() + PATIENCE_SECONDS
        while not condition():
            assert not self.driver.finished(), (
                f"the driver exited before {what}:\n{self.driver.process.tail(40)}"
            )
            assert time.monotonic() < give_up, f"not {what} within {PATIENCE_SECONDS:.0f}s"
            time.sleep(0.1)

    def current(self) -> dict[WorkerId, WorkerInfo]:
        """Each worker's newest registered instance."""
        return {
            (role, index): info
            for role in ("mapper", "reducer")
            for index, info in freshest_workers(workers(self.processor, role)).items()
        }

    def victim(self) -> tuple[int, SparkCut, dict[WorkerId, WorkerInfo]]:
        """The host of a seeded worker (its index), its cut to fill in, and the instances."""
        now = {w: i for w, i in self.current().items() if _alive(i.pid)}
        hosts = {w: executor_address(i.pid) for w, i in now.items()}
        host = hosts[sorted(now)[self.rng.randrange(len(now))]]
        on_host = sorted(w for w, h in hosts.items() if h == host)
        return self.spark.host(host).index, SparkCut("", host, on_host), now

    def landed(self, expected: set[frozenset[int]]) -> bool:
        return self.network.cut_pairs() == expected and not self.driver.finished()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _cut_from_driver(run: _Run) -> SparkCut:
    index, cut, first = run.victim()
    cut.kind = "worker_from_driver"
    run.network.cut(index, [0])
    cut_at = time.monotonic()
    try:
        in_place = run.landed({frozenset((index, 0))})

        def relaunched() -> bool:
            now = run.current()
            for wid in cut.workers:
                info = now.get(wid)
                if wid not in cut.replaced and info is not None and info.pid != first[wid].pid:
                    cut.replaced[wid] = first[wid].pid
                    where = executor_address(info.pid)
                    cut.relaunched.append((f"{wid[0]} {wid[1]}", where, time.monotonic() - cut_at))
            return len(cut.replaced) == len(cut.workers)

        run.wait(relaunched, "the cut host's workers started again elsewhere")
        time.sleep(run.rng.uniform(*run.hold))
        cut.held = time.monotonic() - cut_at
        cut.old_alive_at_heal = sum(map(_alive, cut.replaced.values()))
        cut.landed = in_place and not run.driver.finished()
    finally:
        run.network.heal()
    run.replaced += cut.replaced.values()
    return cut


def _rows_committed(processor: ms.Processor) -> list[int]:
    """Shuffle rows each reducer committed so far, over every mapper."""
    return [sum(i + 1 for i in indices) for indices in committed(processor)]


def _cut_from_store(run: _Run) -> SparkCut:
    assert run.store_host is not None, "a store cut needs the store on a host of its own"
    index, cut, _ = run.victim()
    cut.kind = "worker_from_store"
    cut.old_alive_at_cut = sum(map(_alive, run.replaced))
    run.network.cut(index, [run.store_host])
    cut_at = time.monotonic()
    try:
        in_place = run.landed({frozenset((index, run.store_host))})
        time.sleep(1.0)  # a commit the store received before the cut has been applied
        before = _rows_committed(run.processor)
        time.sleep(max(0.0, cut_at + run.rng.uniform(*STORE_HOLD_SECONDS) - time.monotonic()))
        after = _rows_committed(run.processor)
        cut.held = time.monotonic() - cut_at
        cut.landed = in_place and run.landed({frozenset((index, run.store_host))})
    finally:
        run.network.heal()
    there = {i for role, i in cut.workers if role == "reducer"}
    for r, (b, a) in enumerate(zip(before, after, strict=True)):
        side = "on the cut host" if r in there else "on the other host"
        cut.commits[side] = cut.commits.get(side, 0) + a - b
    return cut


_CUT = {"worker_from_driver": _cut_from_driver, "worker_from_store": _cut_from_store}


def _check_addresses(run: _Run) -> None:
    """Every mapper advertises its executor's host address, and every worker runs on a
    Spark worker host."""
    for (role, index), info in run.current().items():
        host = executor_address(info.pid)
        assert host in run.spark.worker_hosts(), f"{role} {index} runs on {host}"
        if role == "mapper":
            assert info.address.rsplit(":", 1)[0] == host, (
                f"mapper {index} advertises {info.address}, its executor is on {host}"
            )


def run_spark_cut(
    directory: Path,
    seed: int,
    *,
    store: str = "sqlite",
    rows: int = 600_000,
    hold: tuple[float, float] = (1.0, 5.0),
) -> SparkCutResult:
    """Run the keyed sum on Spark across hosts with its store on ``store`` (``"sqlite"``
    or ``"fdb"``: FoundationDB on a host of its own, read from the driver's host; call it
    through :func:`tests.support.hosts.apart.call_apart`), make the cuts of
    :data:`CUTS` in a seeded order while it runs, heal, and check the sums.

    ``hold`` is how long a worker host stays cut from the driver once its workers were
    started again elsewhere.

    Raises:
        AssertionError: The sums differ, a planned cut did not land, a step hung, or the
            run did not drain within :data:`DRAIN_SECONDS` of the last heal.
    """
    rng = random.Random(seed)
    kinds = list(CUTS[store])
    rng.shuffle(kinds)
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000, seed=seed)
    gate = directory / "gate"
    gate.touch()
    store_host = 3 if store == "fdb" else None
    with Cluster(3 if store_host is None else 4) as network, contextlib.ExitStack() as stack:
        url = str(directory / "state.db")
        if store_host is not None:
            fdb = start_foundationdb(network.hosts[store_host], directory / "fdb")
            stack.callback(fdb.stop)
            url = fdb.url
        processor = keyed_processor(
            data,
            url,
            tune=with_tls(tuning(batch_rows=1_000), directory / "tls"),
            mapper=GatedKeyedSumMapper,
            config={"gate": str(gate), "map_seconds": MAP_SECONDS},
        )
        spark = HostedStandaloneCluster(
            directory / "spark", cores=CORES, network=network, store_host=store_host
        )
        stack.callback(spark.stop)
        spark.start_all()  # from this machine's network, which reaches every host
        if store_host is not None:
            stack.enter_context(inside(network.hosts[0]))  # read the store from the driver's
        driver = start_driver(
            spark, processor, directory / "driver", timeout=600, single_host=store_host is None
        )
        stack.callback(driver.process.kill)
        run = _Run(network, spark, processor, driver, rng, hold, store_host)
        run.wait(lambda: len(run.current()) == 4, "every worker registered")
        run.wait(lambda: min(map(min, committed(processor))) >= 0, "started")
        _check_addresses(run)
        cuts = []
        for kind in kinds:
            time.sleep(rng.uniform(0.5, 3.0))
            cuts.append(_CUT[kind](run))
        healed = time.monotonic()
        gate.unlink()
        give_up = healed + DRAIN_SECONDS
        while not driver.finished():
            assert time.monotonic() < give_up, (
                f"not drained {DRAIN_SECONDS:.0f}s after the heal:\n{driver.process.tail(40)}"
            )
            time.sleep(0.1)
        drained = time.monotonic() - healed
        summary = driver.summary()
        old_alive = sum(map(_alive, run.replaced))
        log = [
            line
            for process in [driver.process, *spark.running()]
            for line in process.log.read_text(errors="replace").splitlines()
        ]
        sums = read_output(processor, "sum")
    assert sums == expected_sums(data), "sums differ"
    assert summary["rows_read"] == rows
    missed = [str(c) for c in cuts if not c.landed]
    assert not missed, f"planned cuts did not land: {missed}"
    events = Counter(
        name for line in log for name, pattern in SPARK_EVENTS.items() if pattern.search(line)
    )
    restarts = int(summary["restarts"])
    return SparkCutResult(seed, store, cuts, old_alive, restarts, rows, drained, dict(events))
