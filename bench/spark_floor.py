"""The floor of a Python job's start on Spark: the first commit of the simplest Python job.

The same session as the Spark runner's (:func:`bench.millstream_child.local_session`,
``local[slots]``, PySpark's own daemon) runs one job of ``slots`` partitions whose Python
function does nothing but commit one row to a SQLite database shared by the partitions
(WAL, ``synchronous=FULL``, as millstream's embedded store). Its first commit after the
session is up is as soon as any Python job on this Spark can commit anything: Spark's
scheduling, its daemon's start and imports, the fork of a worker and PySpark's setup of
the task, with nothing of the job's own in between but one small transaction.
:mod:`bench.spark_start` runs it in turns with millstream's job (``--floor``) and puts the
two timelines side by side.

The job's function imports only the standard library (this module and
:mod:`bench.process_clock`), so the floor holds for any job: a real job's imports come on
top.

Run by :mod:`bench.spark_start` as ``python -m bench.spark_floor <out JSON> <settings
JSON>`` (settings: ``slots``, ``database``, ``spark_conf``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bench.process_clock import process_cpu, process_started

BUSY_SECONDS = 30.0
"""How long a partition's commit waits for another's write lock."""


def commit_one(database: str) -> Callable[[int, Iterable[Any]], Iterator[dict[str, float]]]:
    """A partition's function: commit one row to ``database`` and report the clocks."""

    def task(partition: int, _rows: Iterable[Any]) -> Iterator[dict[str, float]]:
        entered = time.time()
        connection = sqlite3.connect(database, timeout=BUSY_SECONDS, isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                "CREATE TABLE IF NOT EXISTS floor (partition INTEGER PRIMARY KEY, t REAL)"
            )
            connection.execute("INSERT OR REPLACE INTO floor VALUES (?, ?)", (partition, entered))
            connection.execute("COMMIT")
            committed = time.time()
        finally:
            connection.close()
        yield {
            "partition": partition,
            "forked": process_started(),
            "parent": process_started(os.getppid()),
            "entered": entered,
            "committed": committed,
            "cpu": time.process_time(),
            "parent_cpu": process_cpu(os.getppid()),
        }

    return task


def main(argv: list[str]) -> None:
    """Start the session, run the job, write the session's time and the tasks' clocks."""
    from bench.millstream_child import local_session

    out, options = argv[:2]
    settings = json.loads(options)
    slots = int(settings["slots"])
    spark = local_session(slots, settings)
    session = time.time()
    try:
        sc = spark.sparkContext
        job = sc.parallelize(range(slots), slots).mapPartitionsWithIndex(
            commit_one(settings["database"])
        )
        tasks = job.collect()
    finally:
        spark.stop()
    with sqlite3.connect(settings["database"]) as connection:
        committed = connection.execute("SELECT count(*) FROM floor").fetchone()[0]
    if committed != slots:
        raise SystemExit(f"the floor's job committed {committed} rows, not {slots}")
    Path(out).write_text(json.dumps({"session": session, "tasks": tasks}))


if __name__ == "__main__":
    main(sys.argv[1:])
