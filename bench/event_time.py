"""Event-time aggregation: millstream's two-stage pipeline against Spark Structured Streaming.

Input: ``--rows`` events ``(ts int64 epoch ms, key int64, value int64)`` in ``--partitions``
Parquet partitions of ``--file-rows`` rows per file, about ``--rate`` events a second per
partition, each up to ``--disorder-ms`` out of order, ``--keys`` distinct keys.

Query: per tumbling one-minute pane of ``ts`` (Spark calls it a window) and per key, the
row count and the sum of ``value``; rows may be ``--disorder-ms`` late.

- **millstream**: stage one is ``ms.event_time`` (:class:`~millstream.event_time.PaneMapper`,
  :class:`~millstream.event_time.PaneReducer`) emitting each closed pane's rows into the
  store queue ``per-minute``, in its commits; stage two reads the queue and writes each
  ``(pane, key)`` result under ``("result", window_start, key)``. Both run side by side
  (``ms.run_local_pipeline``), default ``Tuning``, embedded SQLite store.
- **Spark**: ``withWatermark("ts", disorder)`` then ``groupBy(window("ts", "1 minute"),
  "key").agg(count, sum)``, output mode ``update``, ``foreachBatch`` into an idempotent
  SQLite table keyed by ``(window_start, key)`` (one transaction per batch id), checkpoint on
  local disk, processing-time trigger of 1 s, ``maxFilesPerTrigger`` 8, 2 shuffle
  partitions (:mod:`bench.spark_structured_streaming`'s settings).

Each system runs in a child process whose whole process tree is measured from outside
(:mod:`bench.io_meter`: ``write_bytes`` of ``/proc/<pid>/io``, net of cancelled writes);
both results are read afterwards, outside the measured tree, and compared with the panes
pyarrow computes alone. Reported: seconds from launch to done, CPU seconds of the tree,
and bytes written per input byte (the input's Parquet bytes). ``--keep-log FILE`` keeps a
copy of millstream's store log for :mod:`bench.wal_pages` (where the bytes go).

Run: ``.venv/bin/python -m bench.event_time --rows 2000000`` (``--system millstream`` or
``spark`` for one of them). Results go to ``bench/results/event_time/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.io_meter import run_subprocess

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "event_time"
MINUTE = 60_000


def generate(root: Path, args: argparse.Namespace) -> Path:
    """The event input, written once per parameter set."""
    name = f"events-{args.rows}-{args.partitions}-{args.keys}-{args.disorder_ms}"
    data = root / name
    if (data / "_SUCCESS").exists():
        return data
    rng = np.random.default_rng(17)
    per_partition = args.rows // args.partitions
    step = max(1, 1_000 // args.rate)
    for p in range(args.partitions):
        part = data / f"partition={p}"
        part.mkdir(parents=True, exist_ok=True)
        for f, start in enumerate(range(0, per_partition, args.file_rows)):
            n = min(args.file_rows, per_partition - start)
            ts = (np.arange(start, start + n, dtype=np.int64)) * step
            ts += rng.integers(0, args.disorder_ms + 1, n)
            table = pa.table(
                {
                    "ts": ts,
                    "key": rng.integers(0, args.keys, n, dtype=np.int64),
                    "value": rng.integers(-1_000, 1_000, n, dtype=np.int64),
                }
            )
            pq.write_table(table, part / f"part-{f:05d}.parquet")
    (data / "_SUCCESS").touch()
    return data


def input_bytes(data: Path) -> int:
    """Bytes of the input's Parquet files."""
    return sum(p.stat().st_size for p in data.glob("*/*.parquet"))


def expected(data: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """``(window_start, key) -> (count, sum)`` computed with pyarrow alone."""
    table = pq.ParquetDataset(sorted(str(p) for p in data.glob("*/*.parquet"))).read()
    starts = (np.asarray(table["ts"]) // MINUTE) * MINUTE
    grouped = (
        table.append_column("window_start", pa.array(starts))
        .group_by(["window_start", "key"])
        .aggregate([([], "count_all"), ("value", "sum")])
    )
    return {
        (s, k): (n, v)
        for s, k, n, v in zip(
            grouped["window_start"].to_pylist(),
            grouped["key"].to_pylist(),
            grouped["count_all"].to_pylist(),
            grouped["value_sum"].to_pylist(),
            strict=True,
        )
    }


# --------------------------------------------------------------------------- millstream


REDUCERS = {
    "stored": "PaneReducer",
    "pending": "PendingPaneReducer",
}


def per_minute(disorder_ms: int) -> Any:
    """The query's panes: per tumbling minute of ``ts`` and per key, the row count
    ``n`` and the sum ``total`` of ``value``, into the output ``per-minute``."""
    import millstream as ms

    return ms.event_time.Panes(
        time="ts",
        key="key",
        size=MINUTE,
        lateness=disorder_ms,
        aggregates={"n": (None, "count"), "total": ("value", "sum")},
        output="per-minute",
    )


def millstream_child(args: argparse.Namespace) -> None:
    """Run the two-stage pipeline to the end; write the results as JSON."""
    import millstream as ms

    from bench.event_time_jobs import ByPane, ResultsIntoStore

    run_dir = Path(args.run_dir)
    store = f"sqlite:///{run_dir / 'state.db'}"
    queue = ms.inputs.StoreQueue(store, "per-minute", num_partitions=2)
    # Held open, this connection keeps the other connections' closes from checkpointing
    # the log (and deleting it), so that the whole log can be kept (``--keep-log``).
    holder = sqlite3.connect(run_dir / "state.db") if args.keep_log else None
    if holder is not None:
        holder.execute("SELECT count(*) FROM sqlite_master").fetchall()
    panes = per_minute(args.disorder_ms)
    first = ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=getattr(ms.event_time, REDUCERS[args.reducer]),
        input=ms.inputs.ParquetLog(args.input),
        store=store,
        num_reducers=2,
        name="panes",
        config={"panes": panes},
        outputs=[queue],
    )
    second = ms.Processor(
        mapper=ByPane,
        reducer=ResultsIntoStore,
        input=queue,
        store=store,
        num_reducers=1,
        name="results",
    )
    ms.run_local_pipeline([first, second])
    if holder is not None:
        shutil.copyfile(run_dir / "state.db-wal", args.keep_log)
        holder.close()
    queue.close()  # the last connection: it checkpoints the log, in the measured tree


def millstream_results(run_dir: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """The pipeline's ``(window_start, key) -> (n, total)``, read after its run."""
    from millstream.state import open_store

    from bench.event_time_jobs import decode_result

    results = open_store(f"sqlite:///{run_dir / 'state.db'}", prefix=("results",))
    with results.read() as txn:
        rows = txn.get_range_startswith(("out", "result"))
    results.close()
    return {(key[-2], key[-1]): decode_result(value) for key, value in rows}


# --------------------------------------------------------------------------- spark


def spark_child(args: argparse.Namespace) -> None:
    """Run the event-time query until every input row is in; write the results as JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField, StructType

    from bench.spark_structured_streaming import SparkOptions, _build_session

    run_dir = Path(args.run_dir)
    spark = _build_session(SparkOptions(), run_dir)
    schema = StructType([StructField(n, LongType(), False) for n in ("ts", "key", "value")])
    source = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 8)
        .parquet(str(Path(args.input) / "partition=*" / "*.parquet"))
        .withColumn("event_time", F.timestamp_millis("ts"))
    )
    query_df = (
        source.withWatermark("event_time", f"{args.spark_delay_ms} milliseconds")
        .groupBy(F.window("event_time", "1 minute"), "key")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.unix_millis(F.col("window.start")).alias("window_start"), "key", "n", "total")
    )
    sink_path = run_dir / "sink.db"

    def write(batch_df: Any, batch_id: int) -> None:
        con = sqlite3.connect(sink_path, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.execute("CREATE TABLE IF NOT EXISTS batches (batch_id INTEGER PRIMARY KEY)")
        con.execute(
            "CREATE TABLE IF NOT EXISTS result (window_start INTEGER, key INTEGER, n INTEGER,"
            " total INTEGER, PRIMARY KEY (window_start, key))"
        )
        table = batch_df.toArrow()
        con.execute("BEGIN IMMEDIATE")
        if con.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone():
            con.execute("ROLLBACK")
            con.close()
            return
        con.executemany(
            "INSERT INTO result VALUES (?, ?, ?, ?) ON CONFLICT(window_start, key) DO UPDATE "
            "SET n = excluded.n, total = excluded.total",
            zip(*(c.to_pylist() for c in table.columns), strict=True),
        )
        con.execute("INSERT INTO batches VALUES (?)", (batch_id,))
        con.execute("COMMIT")
        con.close()

    query = (
        query_df.writeStream.outputMode("update")
        .option("checkpointLocation", str(run_dir / "checkpoint"))
        .foreachBatch(write)
        .trigger(processingTime="1 second")
        .start()
    )
    done = 0
    seen: set[int] = set()
    while query.isActive and done < args.rows:
        time.sleep(0.2)
        for progress in query.recentProgress:
            if progress["batchId"] not in seen and progress["numInputRows"]:
                seen.add(progress["batchId"])
                done += progress["numInputRows"]
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    query.stop()
    spark.stop()


def spark_results(run_dir: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """Spark's ``(window_start, key) -> (n, total)``, read after its run."""
    con = sqlite3.connect(run_dir / "sink.db")
    rows = con.execute("SELECT window_start, key, n, total FROM result").fetchall()
    con.close()
    return {(s, k): (n, t) for s, k, n, t in rows}


# --------------------------------------------------------------------------- parent


def spark_delay_ms(args: argparse.Namespace) -> int:
    """Spark's watermark delay: ``--spark-delay-ms``, else the input's event-time span.

    Spark's watermark is the largest event time seen minus the delay, over the whole
    input, so a partition the file source reads later than another looks late and its
    rows are dropped (measured: inexact results at 2 M rows with the disorder as the
    delay). millstream's watermark is the smallest over mappers. A delay as long as the
    input's span keeps Spark exact, and keeps its windows (panes) in its state store longer.
    """
    if args.spark_delay_ms is not None:
        return int(args.spark_delay_ms)
    step = max(1, 1_000 // args.rate)
    return (args.rows // args.partitions) * step + args.disorder_ms


def measure(system: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run one system in a measured child process; its figures and whether it was exact."""
    run_dir = RESULTS / "runs" / system
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "tmp").mkdir(parents=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    command = [
        sys.executable,
        "-m",
        "bench.event_time",
        "--child",
        system,
        "--input",
        str(data),
        "--run-dir",
        str(run_dir),
        "--rows",
        str(args.rows),
        "--disorder-ms",
        str(args.disorder_ms),
        "--spark-delay-ms",
        str(spark_delay_ms(args)),
        "--reducer",
        args.reducer,
        *(["--keep-log", args.keep_log] if args.keep_log else []),
    ]
    launch = time.time()
    status, report = run_subprocess(command, env=env)
    seconds = time.time() - launch
    if status != 0:
        raise RuntimeError(f"{system} child failed with status {status}")
    log = run_dir / "state.db-wal"
    if log.exists() and log.stat().st_size:
        raise RuntimeError(f"{log} left behind: its checkpoint would not be measured")
    got = (spark_results if system == "spark" else millstream_results)(run_dir)
    want = expected(data)
    size = input_bytes(data)
    return {
        "system": system if system == "spark" else f"{system} ({args.reducer})",
        "rows": args.rows,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(report.cpu_seconds, 2),
        "written_bytes": report.write_bytes,
        "net_written_bytes": report.net_write_bytes,
        "written_per_input_byte": round(report.write_bytes / size, 4),
        "net_written_per_input_byte": round(report.net_write_bytes / size, 4),
        "input_bytes": size,
        "panes": len(want),
        "exact": got == want,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rate", type=int, default=1_000, help="events/s per partition")
    parser.add_argument("--disorder-ms", type=int, default=5_000)
    parser.add_argument("--file-rows", type=int, default=100_000)
    parser.add_argument(
        "--spark-delay-ms",
        type=int,
        default=None,
        help="Spark's watermark delay (default: the input's whole event-time span)",
    )
    parser.add_argument(
        "--reducer",
        choices=sorted(REDUCERS),
        default="pending",
        help="millstream's pane reducer: open panes' partials stored with each commit "
        "(PaneReducer) or pending in the mappers' windows (PendingPaneReducer)",
    )
    parser.add_argument(
        "--keep-log",
        default=None,
        help="millstream: copy the store's whole write-ahead log here at the end "
        "(read it with bench.wal_pages; the copy is not counted in the bytes written)",
    )
    parser.add_argument("--system", choices=("both", "millstream", "spark"), default="both")
    parser.add_argument("--child", choices=("millstream", "spark"), help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "millstream":
        millstream_child(args)
        return
    if args.child == "spark":
        spark_child(args)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = generate(RESULTS / "input", args)
    systems = ["millstream", "spark"] if args.system == "both" else [args.system]
    results = []
    for system in systems:
        print(f"running {system} over {args.rows:,} rows ...", flush=True)
        result = measure(system, data, args)
        print(json.dumps(result), flush=True)
        results.append(result)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    (RESULTS / f"event_time-{args.rows}-{stamp}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
