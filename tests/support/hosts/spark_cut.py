"""A worker host cut from the Spark driver while a keyed sum runs on a Spark standalone
cluster across hosts (:mod:`tests.support.hosts.spark_cluster`), then healed.

Host 0 runs the master and the driver, hosts 1 and 2 a Spark worker each (one executor of
:data:`CORES` task slots: the four millstream workers spread two and two, and either
executor has the slots for all four). At a seeded moment the host of a seeded millstream
worker is cut from host 0 only: it still reaches the other worker host (GetRows) and the
store (a shared file). The cut holds until Spark has started every worker of the cut host
again on the other host, and a seeded while after; then it heals and the mappers run at
full speed. The sums must equal the input's, and the run must drain within
:data:`DRAIN_SECONDS` of the heal.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import millstream as ms
from millstream.ledger.discovery import WorkerInfo, freshest_workers

from tests.support.hosts.cluster import Cluster
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

DRAIN_SECONDS = 60.0
"""The run must drain within this long after the heal."""

PATIENCE_SECONDS = 180.0
"""How long a step may take before the scenario gives up: only a hung run reaches it."""

MAP_SECONDS = 0.5
"""A mapper's pause per batch of 1,000 rows until the heal: 4,000 rows a second."""

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


@dataclass
class SparkCutResult:
    """What one cut did."""

    seed: int
    cut_host: str
    cut: str
    relaunched: list[tuple[str, str, float]]
    """The cut host's millstream workers, the host Spark started each again on, and how
    long after the cut."""
    zombies_at_heal: int
    """Old instances on the cut host still alive when the cut healed."""
    zombies_left: int
    """Old instances on the cut host still alive after the drain."""
    restarts: int
    rows: int
    seconds_to_drain_after_heal: float
    spark: dict[str, int]

    def __str__(self) -> str:
        events = ", ".join(f"{k} x{n}" for k, n in self.spark.items() if n)
        moved = "; ".join(f"{w} on {h} {t:.1f}s after the cut" for w, h, t in self.relaunched)
        return (
            f"spark seed {self.seed}: {self.rows} rows exact; {self.cut}; started again: "
            f"{moved}; {self.restarts} failed tasks; old instances alive at the heal "
            f"{self.zombies_at_heal}, after the drain {self.zombies_left}; drained "
            f"{self.seconds_to_drain_after_heal:.1f}s after the heal; Spark: {events}"
        )


def _wait(condition: Callable[[], bool], what: str, driver: Driver) -> None:
    give_up = time.monotonic() + PATIENCE_SECONDS
    while not condition():
        assert not driver.finished(), f"the driver exited before {what}:\n{driver.process.tail(40)}"
        assert time.monotonic() < give_up, f"not {what} within {PATIENCE_SECONDS:.0f}s"
        time.sleep(0.1)


def _current(processor: ms.Processor) -> dict[tuple[str, int], WorkerInfo]:
    return {
        (role, index): info
        for role in ("mapper", "reducer")
        for index, info in freshest_workers(workers(processor, role)).items()
    }


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_spark_cut(
    directory: Path, seed: int, *, rows: int = 600_000, hold: tuple[float, float] = (1.0, 5.0)
) -> SparkCutResult:
    """Run the keyed sum on Spark across hosts, cut the host of a seeded worker from the
    driver's host while it runs, heal, and check the sums.

    Raises:
        AssertionError: The sums differ, a step hung, or the run did not drain within
            :data:`DRAIN_SECONDS` of the heal.
    """
    rng = random.Random(seed)
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000, seed=seed)
    gate = directory / "gate"
    gate.touch()
    processor = keyed_processor(
        data,
        directory / "state.db",
        tune=with_tls(tuning(batch_rows=1_000), directory / "tls"),
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": MAP_SECONDS},
    )
    with Cluster(3) as network:
        spark = HostedStandaloneCluster(directory / "spark", cores=CORES, network=network)
        driver: Driver | None = None
        try:
            spark.start_all()
            driver = start_driver(spark, processor, directory / "driver", timeout=600)
            _wait(lambda: len(_current(processor)) == 4, "every worker registered", driver)
            _wait(lambda: min(map(min, committed(processor))) >= 0, "started", driver)
            first = _current(processor)
            hosts = {wid: executor_address(info.pid) for wid, info in first.items()}
            victim = sorted(first)[rng.randrange(len(first))]
            cut_host = hosts[victim]
            on_cut = sorted(wid for wid, h in hosts.items() if h == cut_host)
            time.sleep(rng.uniform(0.5, 3.0))
            network.cut(spark.host(cut_host).index, [0])
            cut_at = time.monotonic()
            moved: dict[tuple[str, int], tuple[str, str, float]] = {}

            def relaunched() -> bool:
                now = _current(processor)
                for wid in on_cut:
                    info = now.get(wid)
                    if wid not in moved and info is not None and info.pid != first[wid].pid:
                        where = executor_address(info.pid)
                        moved[wid] = (f"{wid[0]} {wid[1]}", where, time.monotonic() - cut_at)
                return len(moved) == len(on_cut)

            _wait(relaunched, "the cut host's workers started again elsewhere", driver)
            time.sleep(rng.uniform(*hold))
            held = time.monotonic() - cut_at
            zombies_at_heal = sum(_alive(first[wid].pid) for wid in on_cut)
            network.heal()
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
            zombies = sum(_alive(first[wid].pid) for wid in on_cut)
            log = [
                line
                for process in [driver.process, *spark.running()]
                for line in process.log.read_text(errors="replace").splitlines()
            ]
        finally:
            if driver is not None:
                driver.process.kill()
            spark.stop()
    assert read_output(processor, "sum") == expected_sums(data), "sums differ"
    assert summary["rows_read"] == rows
    events = Counter(
        name for line in log for name, pattern in SPARK_EVENTS.items() if pattern.search(line)
    )
    cut = (
        f"host {cut_host} (with {', '.join(f'{r} {i}' for r, i in on_cut)}) cut from the "
        f"driver's host for {held:.1f}s"
    )
    return SparkCutResult(
        seed,
        cut_host,
        cut,
        [moved[wid] for wid in on_cut],
        zombies_at_heal,
        zombies,
        int(summary["restarts"]),
        rows,
        drained,
        dict(events),
    )
