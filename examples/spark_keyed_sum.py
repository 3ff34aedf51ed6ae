"""Keyed sum through Spark: a DataFrame in, millstream workers as Spark tasks, a DataFrame out.

Run it with ``spark-submit examples/spark_keyed_sum.py`` (or ``python
examples/spark_keyed_sum.py``; both run on ``local[4,3]`` unless ``--master`` or
``SPARK_MASTER`` names another master), or from a notebook with an existing session::

    from examples.spark_keyed_sum import main
    main(spark)

It builds ``MILLSTREAM_EXAMPLE_ROWS`` rows (default 1,000,000: an int64 key over 100,000
keys and an int64 value) as a DataFrame, appends them to a store-backed queue with 2
partitions from the executors, runs 2 mappers and 2 reducers as one Spark job, reads the
``("sum", key)`` counters back as a DataFrame and checks them against Spark's own
``groupBy``. The state lives in a fresh SQLite file under ``MILLSTREAM_EXAMPLE_DIR``
(default ``/tmp/millstream-spark-keyed-sum``), so every executor must run on this machine:
on a standalone cluster whose workers all run here, set ``MILLSTREAM_EXAMPLE_SINGLE_HOST=1``
to say so (``millstream.spark.run`` refuses SQLite on a cluster otherwise); on a real
cluster set ``MILLSTREAM_EXAMPLE_STORE`` to an ``fdb://`` store.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import millstream as ms
import millstream.spark as mss
import pyarrow as pa
from millstream.inputs import StoreQueue

ROOT = Path(os.environ.get("MILLSTREAM_EXAMPLE_DIR", "/tmp/millstream-spark-keyed-sum"))
ROWS = int(os.environ.get("MILLSTREAM_EXAMPLE_ROWS", "1000000"))
SINGLE_HOST = os.environ.get("MILLSTREAM_EXAMPLE_SINGLE_HOST", "") not in ("", "0")
LOCAL_MASTER = "local[4,3]"  # 2 mappers + 2 reducers, each task tried 3 times
KEYS = 100_000
NAME = "spark_keyed_sum"


class PreAggregate(ms.Mapper):
    """Sums ``value`` per ``key`` within the batch, then routes each key by hash."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)


class SumIntoStore(ms.Reducer):
    """Folds the partial sums and adds them to the ``("sum", key)`` counters."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        txn.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())


def main(spark: Any, rows: int = ROWS, root: Path = ROOT) -> ms.RunSummary:
    """Run the keyed sum on ``spark`` over a fresh store; returns the run's summary."""
    from pyspark.sql import functions as F

    root.mkdir(parents=True, exist_ok=True)
    db = root / "state.db"
    for stale in root.glob("state.db*"):  # the database, its log, its lock and watch files
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink()
    store = os.environ.get("MILLSTREAM_EXAMPLE_STORE") or f"sqlite:///{db}"
    queue = StoreQueue(store, "input", 2, prefix=(NAME,))
    processor = ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=queue,
        store=store,
        num_reducers=2,
        name=NAME,
        tuning=ms.Tuning(batch_rows=250_000, commit_interval_seconds=0.5),
    )
    df = spark.range(rows, numPartitions=4).select(
        F.pmod(F.hash("id"), F.lit(KEYS)).cast("long").alias("key"),
        (F.col("id") * 7919 % 2000 - 1000).alias("value"),
    )
    written = mss.write_queue(df, queue, close=True)
    print(f"appended {written:,} rows to the queue")

    summary = mss.run(spark, processor, timeout=600, single_host=SINGLE_HOST)
    print(f"millstream on Spark: {summary}")

    out = mss.read_output(spark, processor, ("sum",))
    expected = df.groupBy("key").agg(F.sum("value").alias("value"))
    diff = out.exceptAll(expected).count() + expected.exceptAll(out).count()
    print(f"{out.count():,} keys; rows differing from Spark's groupBy: {diff}")
    if diff:
        raise SystemExit("the keyed sum differs from Spark's groupBy")
    return summary


def _master() -> str:
    """``SPARK_MASTER``, else spark-submit's ``--master``, else ``local[4,3]``.

    ``local[*]`` (what spark-submit and pyspark pick when no master is given) becomes
    ``local[4,3]``: the job needs 4 task slots, and retries make a killed task harmless.
    """
    from pyspark import SparkConf, SparkContext

    chosen = os.environ.get("SPARK_MASTER")
    if not chosen:
        SparkContext._ensure_initialized()  # reads spark-submit's configuration
        chosen = SparkConf().get("spark.master", None)
    return LOCAL_MASTER if chosen in (None, "", "local[*]") else chosen


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.appName("millstream keyed sum")
        .master(_master())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.daemon.module", "millstream.spark.daemon")
        .getOrCreate()
    )
    try:
        main(session)
    finally:
        session.stop()
