"""The keyed sum through Spark: exact results, a killed worker, a zombie, slots, cancelling.

Every test drives ``examples.keyed_sum``'s mapper and reducer over a store-backed queue on
a ``local[4,3]`` session: 2 mappers + 2 reducers fill the 4 slots, and a task is tried up
to 3 times. Tests that act during a run keep the queue unsealed until they are done, so the
workers are certainly running when they are killed or cancelled.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from millstream.exceptions import ConfigurationError, MillstreamError
from millstream.inputs.store_queue import StoreQueue
from millstream.spark import read_output, run, write_queue
from millstream.workers import run_worker

from tests.support.spark_jobs import (
    Background,
    append_and_seal,
    expected_sums,
    got_sums,
    make_processor,
    make_rows,
    wait_for,
    workers,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:\tZ") for line in f)
    except FileNotFoundError:
        return False


def port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def listeners(addresses: list[str]) -> str:
    """Who listens on the addresses' ports (``ss``), for failure messages."""
    ports = [a.rpartition(":")[2] for a in addresses]
    try:
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return "ss unavailable"
    return "\n".join(line for line in out.splitlines() if any(f":{p} " in line for p in ports))


def test_keyed_sum_is_exact(spark: Any, tmp_path: Path) -> None:
    processor, queue = make_processor(tmp_path)
    table = make_rows(20_000, seed=1)
    df = spark.createDataFrame(table).repartition(3)
    assert write_queue(df, queue, close=True) == table.num_rows

    summary = run(spark, processor, timeout=120)

    assert summary.rows_read == table.num_rows
    assert summary.restarts == 0
    assert got_sums(processor) == expected_sums(table)
    out = read_output(spark, processor, ("sum",))
    assert out.count() == len(expected_sums(table))
    assert {row["key"]: row["value"] for row in out.collect()} == expected_sums(table)


def test_one_mapper_task_reads_several_partitions_exactly(spark: Any, tmp_path: Path) -> None:
    processor, queue = make_processor(tmp_path, partitions=3)
    processor = dataclasses.replace(processor, num_mappers=1)
    table = make_rows(9_000, seed=4)
    assert write_queue(spark.createDataFrame(table).repartition(3), queue, close=True) == 9_000

    summary = run(spark, processor, timeout=120)

    assert summary.rows_read == table.num_rows
    assert got_sums(processor) == expected_sums(table)  # the one mapper task read all three


def test_write_queue_retried_task_appends_each_row_once(spark: Any, tmp_path: Path) -> None:
    # Two Spark partitions of about 11 MB: each appends a few 4 MB pieces before its
    # first attempt fails near its end; Spark retries the task.
    rows = 200_000

    def fail_first_attempt_late(batches: Any) -> Any:  # defined here: pickled by value
        from pyspark import TaskContext

        ctx = TaskContext.get()
        half = rows // 2
        for batch in batches:
            ids = batch.column(0)
            last = ids[len(ids) - 1].as_py()
            if ctx is not None and ctx.attemptNumber() == 0 and last % half >= half * 9 // 10:
                raise RuntimeError("injected: the first attempt dies after appending")
            yield pa.record_batch({"id": ids, "payload": pa.array([b"x" * 100] * len(ids))})

    queue = StoreQueue(f"sqlite:///{tmp_path / 'retried.db'}", "retried", 2)
    df = spark.range(0, rows, 1, 2).mapInArrow(fail_first_attempt_late, "id long, payload binary")
    assert write_queue(df, queue, close=True) == rows
    ids: list[int] = []
    for p in range(2):
        at = 0
        while (batch := queue.read(p, at, 50_000).batch) is not None:
            ids.extend(batch.column("id").to_pylist())
            at += batch.num_rows
    assert len(ids) == rows, f"{len(ids) - len(set(ids))} rows appended twice"
    assert sorted(ids) == list(range(rows))


def test_write_queue_by_column(spark: Any, tmp_path: Path) -> None:
    _, queue = make_processor(tmp_path)
    table = make_rows(5_000, seed=2)
    table = table.append_column("part", pa.compute.bit_wise_and(table["key"], 1))
    df = spark.createDataFrame(table).repartition(2)
    assert write_queue(df, queue, partition_by="part", close=True) == table.num_rows
    for p in range(2):
        assert queue.end_row_index(p) == pa.compute.sum(pa.compute.equal(table["part"], p)).as_py()
        batch = queue.read(p, 0, 10_000).batch
        assert batch is not None
        assert set(batch.column("part").to_pylist()) == {p}


def test_killed_worker_is_retried_and_results_stay_exact(spark: Any, tmp_path: Path) -> None:
    processor, queue = make_processor(tmp_path)
    first, second = make_rows(10_000, seed=3), make_rows(10_000, seed=4)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = Background(spark, processor, timeout=150)
    victim = wait_for(
        lambda: next(iter(w for w in workers(processor, "mapper") if w.index == 0), None),
        60,
        "mapper 0 to register",
    )
    wait_for(lambda: len(workers(processor, "reducer")) == 2, 60, "both reducers")
    os.kill(victim.pid, signal.SIGKILL)
    wait_for(
        lambda: any(w.index == 0 and w.pid != victim.pid for w in workers(processor, "mapper")),
        60,
        "Spark to retry mapper 0",
    )
    append_and_seal(queue, second)

    summary = background.join()

    assert summary.restarts >= 1
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)


def test_zombie_mapper_beside_the_spark_task_keeps_results_exact(
    spark: Any, tmp_path: Path
) -> None:
    processor, queue = make_processor(tmp_path)
    first, second = make_rows(10_000, seed=5), make_rows(10_000, seed=6)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = Background(spark, processor, timeout=150)
    wait_for(lambda: len(workers(processor, "mapper")) == 2, 60, "both mappers")
    zombie = mp.get_context("spawn").Process(
        target=run_worker, args=(processor, "mapper", 0), daemon=True
    )
    zombie.start()
    try:
        wait_for(
            lambda: sum(w.index == 0 for w in workers(processor, "mapper")) >= 2,
            60,
            "the second mapper 0 instance",
        )
        append_and_seal(queue, second)
        summary = background.join()
    finally:
        zombie.join(30)
        if zombie.exitcode is None:
            zombie.kill()
            zombie.join()
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)


def test_too_few_slots_fails_at_once(spark: Any, tmp_path: Path) -> None:
    processor, _ = make_processor(tmp_path, partitions=3)
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"needs 5 concurrent task slots .* has 4"):
        run(spark, processor, timeout=30)
    assert time.monotonic() - started < 5
    assert workers(processor, "mapper") == []


def test_cancelling_the_job_leaves_no_worker_or_port(spark: Any, tmp_path: Path) -> None:
    processor, queue = make_processor(tmp_path)
    for p in range(2):
        queue.append(p, make_rows(2_000, seed=7 + p))
    background = Background(spark, processor, job_group="millstream-cancel-test")
    wait_for(
        lambda: len(workers(processor, "mapper")) == 2 and len(workers(processor, "reducer")) == 2,
        60,
        "every worker to register",
    )
    mappers, reducers = workers(processor, "mapper"), workers(processor, "reducer")
    assert all(port_open(w.address) for w in mappers)

    spark.sparkContext.cancelJobGroup("millstream-cancel-test")

    with pytest.raises(MillstreamError, match="cancel"):
        background.join(60)
    pids = {w.pid for w in mappers + reducers}
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 30, "worker processes to end")
    wait_for(
        lambda: not any(port_open(w.address) for w in mappers),
        10,
        "mapper ports to close: " + listeners([w.address for w in mappers]),
    )


def test_stream_outlives_more_task_failures_than_spark_allows(spark: Any, tmp_path: Path) -> None:
    # local[4,3]: Spark fails the job when one task fails 3 times over its life. A stream
    # runs for weeks, so failures far apart must not end it: the runner submits again.
    processor, queue = make_processor(tmp_path)
    first, second = make_rows(10_000, seed=15), make_rows(10_000, seed=16)
    for p in range(2):
        queue.append(p, first.slice(p * 5_000, 5_000))
    background = Background(spark, processor, timeout=170)
    killed: list[int] = []
    for _ in range(4):
        victim = wait_for(
            lambda: next(
                (w for w in workers(processor, "mapper") if w.index == 0 and w.pid not in killed),
                None,
            ),
            60,
            "a new mapper 0",
        )
        os.kill(victim.pid, signal.SIGKILL)
        killed.append(victim.pid)
    wait_for(
        lambda: any(w.index == 0 and w.pid not in killed for w in workers(processor, "mapper")),
        60,
        "mapper 0 after the last kill",
    )
    append_and_seal(queue, second)

    summary = background.join(150)

    assert summary.restarts >= 4
    assert summary.rows_read == 20_000
    assert got_sums(processor) == expected_sums(first, second)
