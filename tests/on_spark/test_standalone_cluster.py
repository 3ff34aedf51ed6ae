"""millstream on a Spark standalone cluster: a master and two workers on their own addresses.

The workers listen on 127.0.0.2 and 127.0.0.3 (``SPARK_LOCAL_IP``), and every mapper's
GetRows server binds only its executor's address: a mapper that advertised anything else
(127.0.0.1, the old default) would be unreachable and the run would not drain, and the
tests check each registered address against its executor's. The state store is SQLite
(``single_host=True``: the "hosts" share this machine), so the cluster needs no service
beyond Spark itself.

The module starts the cluster once (about 20 s on a loaded 2-core machine): first
``spark-submit`` runs the example against it, then one session runs the keyed sum through
a killed Python worker, a cluster that is still coming up, and a lost executor, and once
more with its state on the session's FoundationDB cluster and no ``single_host`` (the
design's deployment) through a killed mapper and reducer.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import WorkerInfo
from millstream.spark import run
from millstream.spark.slots import available_slots
from millstream.state import open_store
from millstream.state.fdb_backend import HOME_VARIABLE

from examples.keyed_sum import PreAggregate, SumIntoStore
from tests.support.sockets import listening_hosts
from tests.support.spark_jobs import (
    NAME,
    Background,
    append_and_seal,
    expected_sums,
    got_sums,
    make_processor,
    make_rows,
    wait_for,
    workers,
)
from tests.support.spark_standalone import (
    MASTER_HOST,
    StandaloneCluster,
    executor_address,
    require_spark,
    spark_submit,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    require_spark()
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"))
    try:
        cluster.start(HOSTS)
        yield cluster
    finally:
        cluster.stop()


def _cluster_conf(cluster: StandaloneCluster) -> dict[str, str]:
    return {
        "spark.master": cluster.url,
        "spark.driver.host": MASTER_HOST,
        "spark.driver.bindAddress": MASTER_HOST,
        "spark.executor.cores": str(cluster.cores),
        "spark.cores.max": str(cluster.cores * len(HOSTS)),
        "spark.executor.memory": "512m",
        "spark.ui.enabled": "false",
        "spark.python.task.killTimeout": "1s",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
    }


@pytest.fixture(scope="module")
def cluster_spark(cluster: StandaloneCluster) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName("millstream-standalone-tests")
    for key, value in _cluster_conf(cluster).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def check_mapper_addresses(mappers: list[WorkerInfo]) -> None:
    """Each mapper advertises its executor's address and listens on nothing else."""
    for info in mappers:
        host, _, port = info.address.rpartition(":")
        assert host == executor_address(info.pid), (
            f"mapper {info.index} advertises {info.address} but its executor is on "
            f"{executor_address(info.pid)}"
        )
        assert host in HOSTS
        assert listening_hosts(int(port), info.pid) == {host}


def run_processor(spark: Any, processor: ms.Processor, **kwargs: Any) -> Background:
    return Background(spark, processor, single_host=True, **kwargs)


def test_spark_submit_runs_the_example_on_the_cluster(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    conf = _cluster_conf(cluster)
    args = ["--master", conf.pop("spark.master")]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    done = spark_submit(
        ROOT / "examples" / "spark_keyed_sum.py",
        args,
        {
            "MILLSTREAM_EXAMPLE_DIR": str(tmp_path),
            "MILLSTREAM_EXAMPLE_ROWS": "20000",
            "MILLSTREAM_EXAMPLE_SINGLE_HOST": "1",
        },
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rows differing from Spark's groupBy: 0" in done.stdout
    assert "on Spark: drained: 20,000 rows read" in done.stdout


def test_keyed_sum_is_exact_through_a_killed_python_worker(
    cluster_spark: Any, tmp_path: Path
) -> None:
    processor, queue = make_processor(tmp_path)
    first, second = make_rows(10_000, seed=11), make_rows(10_000, seed=12)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = run_processor(cluster_spark, processor, timeout=240)
    mappers = wait_for(
        lambda: (found := workers(processor, "mapper")) and len(found) == 2 and found,
        120,
        "both mappers",
    )
    wait_for(lambda: len(workers(processor, "reducer")) == 2, 60, "both reducers")
    check_mapper_addresses(mappers)
    assert {executor_address(m.pid) for m in mappers} <= set(HOSTS)

    victim = next(m for m in mappers if m.index == 0)
    os.kill(victim.pid, signal.SIGKILL)
    retried = wait_for(
        lambda: next(
            (w for w in workers(processor, "mapper") if w.index == 0 and w.pid != victim.pid),
            None,
        ),
        120,
        "Spark to retry mapper 0",
    )
    check_mapper_addresses([retried])
    append_and_seal(queue, second)

    summary = background.join(240)

    assert summary.restarts >= 1
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)


def test_waits_for_a_worker_and_survives_a_lost_executor(
    cluster: StandaloneCluster, cluster_spark: Any, tmp_path: Path, capfd: Any
) -> None:
    lost = HOSTS[1]
    cluster.kill_worker(lost)  # the cluster is "still coming up": half the slots
    # The driver hears of the lost executor a while after the kill; until then it still
    # counts its slots, and the launch would not wait.
    sc = cluster_spark.sparkContext
    wait_for(
        lambda: available_slots(sc).count <= cluster.cores,
        60,
        "the driver to drop the killed worker's executor",
    )
    processor, queue = make_processor(tmp_path)
    first, second = make_rows(10_000, seed=13), make_rows(10_000, seed=14)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = run_processor(cluster_spark, processor, timeout=280)
    wait_for(lambda: "waiting up to" in capfd.readouterr().err, 60, "the slot wait to start")
    cluster.start_worker(lost)
    wait_for(
        lambda: len(workers(processor, "mapper")) == 2 and len(workers(processor, "reducer")) == 2,
        120,
        "every worker to register",
    )
    everyone = [(role, w) for role in ("mapper", "reducer") for w in workers(processor, role)]
    on_lost = [(role, w.index, w.pid) for role, w in everyone if executor_address(w.pid) == lost]
    assert on_lost, "no millstream worker ran on the second Spark worker"

    cluster.kill_worker(lost)  # executor lost mid-run
    cluster.start_worker(lost)

    def restarted() -> bool:
        return all(
            any(w.index == index and w.pid != pid for w in workers(processor, role))
            for role, index, pid in on_lost
        )

    wait_for(restarted, 180, "Spark to restart the lost executor's workers")
    check_mapper_addresses(workers(processor, "mapper"))
    append_and_seal(queue, second)

    summary = background.join(240)

    assert summary.restarts >= len(on_lost)
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)


def test_sqlite_on_the_cluster_is_refused_unless_single_host(
    cluster_spark: Any, tmp_path: Path
) -> None:
    processor, queue = make_processor(tmp_path)
    append_and_seal(queue, make_rows(1_000, seed=17))
    with pytest.raises(ConfigurationError, match=r"SQLite store .* non-local master 'spark://"):
        run(cluster_spark, processor, timeout=60)
    assert workers(processor, "mapper") == []


def _fdb_processor(url: str) -> tuple[ms.Processor, StoreQueue]:
    """The keyed sum of :func:`make_processor` with its queue and state on FoundationDB."""
    store = open_store(url)
    try:
        store.transact(lambda txn: txn.clear_range_startswith(()))
    finally:
        store.close()
    queue = StoreQueue(url, "input", 2, prefix=(NAME,))
    processor = ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=queue,
        store=url,
        num_reducers=2,
        name=NAME,
        tuning=ms.Tuning(batch_rows=2_000, commit_interval_seconds=0.1, heartbeat_seconds=0.2),
    )
    return processor, queue


@pytest.mark.fdb
def test_keyed_sum_on_foundationdb_without_single_host(cluster_spark: Any, fdb_url: str) -> None:
    """The design's deployment: every executor reaches the store by its cluster file, so
    the run needs no ``single_host`` (SQLite needs it; the executors' loopback addresses
    need none under a master on loopback, which only this machine's workers can join). A
    mapper's and a reducer's Python workers are killed mid-run; the totals stay exact."""
    processor, queue = _fdb_processor(fdb_url)
    # The executors load libfdb_c from the same folder as this process.
    if HOME_VARIABLE in os.environ:
        cluster_spark.sparkContext.environment[HOME_VARIABLE] = os.environ[HOME_VARIABLE]
    first, second = make_rows(10_000, seed=21), make_rows(10_000, seed=22)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = Background(cluster_spark, processor, timeout=240)
    mappers = wait_for(
        lambda: (
            (background.thread.is_alive() or background.join())  # raises a refusal
            and (found := workers(processor, "mapper"))
            and len(found) == 2
            and found
        ),
        120,
        "both mappers",
    )
    reducers = wait_for(
        lambda: (found := workers(processor, "reducer")) and len(found) == 2 and found,
        60,
        "both reducers",
    )
    check_mapper_addresses(mappers)
    victims = [("mapper", mappers[0]), ("reducer", reducers[1])]
    for _, victim in victims:
        os.kill(victim.pid, signal.SIGKILL)
    wait_for(
        lambda: all(
            any(w.index == v.index and w.pid != v.pid for w in workers(processor, role))
            for role, v in victims
        ),
        120,
        "Spark to retry the killed mapper and reducer",
    )
    check_mapper_addresses(workers(processor, "mapper"))
    append_and_seal(queue, second)

    summary = background.join(240)

    assert summary.restarts >= 2
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)
