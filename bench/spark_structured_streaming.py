"""The two benchmark workloads in Spark Structured Streaming, exactly-once, on ``local[N]``.

Query: a file-source ``readStream`` over the workload's Parquet partition directories (schema
given, ``maxFilesPerTrigger`` files per micro-batch), then

* ``keyed_sum``: ``groupBy("key").agg(sum("value"))``, output mode ``update``;
* ``counters``: ``groupBy("key").agg(...)`` of 1, 2 or 4 counters (:mod:`bench.counters`),
  output mode ``update``;
* ``smallest``: ``groupBy("key").applyInPandasWithState(...)`` keeping per key the row count
  and the three smallest payloads, which no partial aggregation can combine before the
  shuffle (Spark ships every row to its key's state), output mode ``update``;

written through ``foreachBatch`` into a SQLite table keyed by ``key`` (WAL, ``synchronous=
FULL``): one transaction per micro-batch upserts the updated keys and records the batch id,
and a batch id already recorded is skipped. Spark's exactly-once recipe is this: a
replayable source and offsets in the checkpoint (``checkpointLocation`` on local disk,
written ahead of each batch), state in the checkpointed state store, and an idempotent sink
keyed by batch id, so a batch replayed after a crash changes nothing.

Trigger: ``processingTime="1 second"`` by default: what a continuously running exactly-once
pipeline uses (a micro-batch at most every second, so commits are at most ~1 s apart when
the system keeps up, the same cadence the millstream budget assumes). ``--trigger
available-now`` processes what is there in ``maxFilesPerTrigger``-sized batches and stops
(Spark's incremental-batch mode); both are exactly-once.

The query runs in a child process (``--child``) so that the whole Spark process tree
(Python driver, JVM, Python workers) is measured by :mod:`bench.io_meter` from outside;
the checkpoint and Spark's local (shuffle) directory are measured with
:mod:`bench.dir_meter`, and the sink by its writer, the Python driver.

Run: ``.venv/bin/python -m bench.spark_structured_streaming --rows 1000000 --workload
keyed_sum`` (``--help`` for the knobs). Results go to ``bench/results/spark/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.counters import CHOICES as COUNTER_CHOICES
from bench.counters import names as counter_names
from bench.counters import spark_columns
from bench.dir_meter import DirectoryMeter
from bench.io_meter import ProcessIO, run_subprocess
from bench.result import BatchRecord, RunResult, loadavg, print_result
from bench.verify import compare
from bench.workload import SCHEMA, Workload, add_spec_arguments, generate, spec_from_args

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WORKLOADS = ("keyed_sum", "smallest", "counters")


@dataclass(frozen=True)
class SparkOptions:
    """The Spark knobs that were tuned for this machine.

    Args:
        cores: ``local[cores]``.
        max_files_per_trigger: Files (of ``rows_per_file`` rows) per micro-batch.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (and state-store partitions);
            the default 200 is far too many for two cores.
        trigger: ``processing-time`` or ``available-now``.
        trigger_seconds: Interval of the processing-time trigger.
        driver_memory: ``spark.driver.memory`` (local mode: the only JVM).
        state_store: ``hdfs`` (Spark's default provider) or ``rocksdb``.
    """

    cores: int = 2
    max_files_per_trigger: int = 8
    shuffle_partitions: int = 2
    trigger: str = "processing-time"
    trigger_seconds: float = 1.0
    driver_memory: str = "4g"
    state_store: str = "hdfs"


# --------------------------------------------------------------------------- child process


class SqliteSink:
    """Idempotent ``foreachBatch`` sink: one SQLite transaction per batch id."""

    def __init__(self, path: Path, workload: str, counters: int = 1) -> None:
        self.path = path
        self.workload = workload
        self.counters = counters
        self.applied: list[dict[str, float]] = []
        self._con: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._con is None:
            con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("CREATE TABLE IF NOT EXISTS batches (batch_id INTEGER PRIMARY KEY)")
            if self.workload == "keyed_sum":
                con.execute(
                    "CREATE TABLE IF NOT EXISTS result (key INTEGER PRIMARY KEY, total INTEGER)"
                )
            elif self.workload == "counters":
                columns = "".join(f", {c} INTEGER" for c in counter_names(self.counters))
                con.execute(f"CREATE TABLE IF NOT EXISTS result (key INTEGER PRIMARY KEY{columns})")
            else:
                con.execute(
                    "CREATE TABLE IF NOT EXISTS result (key INTEGER PRIMARY KEY, count INTEGER,"
                    " s0 TEXT, s1 TEXT, s2 TEXT)"
                )
            self._con = con
        return self._con

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        start = time.time()
        con = self._connect()
        table = batch_df.toArrow()
        columns = [c.to_pylist() for c in table.columns]
        names = table.column_names
        placeholders = ", ".join("?" for _ in names)
        updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "key")
        con.execute("BEGIN IMMEDIATE")
        try:
            if con.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,)).fetchone():
                con.execute("ROLLBACK")
                return
            con.executemany(
                f"INSERT INTO result ({', '.join(names)}) VALUES ({placeholders}) "
                f"ON CONFLICT(key) DO UPDATE SET {updates}",
                zip(*columns, strict=True),
            )
            con.execute("INSERT INTO batches VALUES (?)", (batch_id,))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self.applied.append(
            {"batch_id": batch_id, "keys": table.num_rows, "start": start, "end": time.time()}
        )


def _smallest_function() -> Callable[..., Iterator[Any]]:
    """The ``applyInPandasWithState`` function (a closure, so Spark ships it by value)."""
    import heapq

    import pandas as pd

    def smallest(key: tuple[int], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        if state.exists:
            count, *kept = state.get
            best = [s for s in kept if s is not None]
        else:
            count, best = 0, []
        for pdf in pdfs:
            count += len(pdf)
            best = heapq.nsmallest(3, [*best, *pdf["payload"].tolist()])
        padded = [*best, None, None, None][:3]
        state.update((count, *padded))
        yield pd.DataFrame(
            {
                "key": [key[0]],
                "count": [count],
                "s0": [padded[0]],
                "s1": [padded[1]],
                "s2": [padded[2]],
            }
        )

    return smallest


def _build_session(opts: SparkOptions, run_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{opts.cores}]")
        .appName("millstream-bench")
        .config("spark.driver.memory", opts.driver_memory)
        .config("spark.sql.shuffle.partitions", str(opts.shuffle_partitions))
        .config("spark.local.dir", str(run_dir / "spark-local"))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={run_dir / 'tmp'}")
    )
    if opts.state_store == "rocksdb":
        builder = builder.config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        ).config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _spark_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {pa.int64(): LongType(), pa.string(): StringType()}
    return StructType([StructField(f.name, types[f.type], False) for f in SCHEMA])


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def run_child(args: argparse.Namespace) -> None:
    """Run the query in this process until all input is committed; write ``child.json``."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    started = time.time()
    run_dir = Path(args.run_dir)
    opts = SparkOptions(**json.loads(args.options))
    spark = _build_session(opts, run_dir)
    session_ready = time.time()
    source = (
        spark.readStream.schema(_spark_schema())
        .option("maxFilesPerTrigger", opts.max_files_per_trigger)
        .parquet(str(Path(args.input) / "partition=*" / "*.parquet"))
    )
    if args.workload == "keyed_sum":
        query_df = source.groupBy("key").agg(F.sum("value").alias("total"))
    elif args.workload == "counters":
        query_df = source.groupBy("key").agg(*spark_columns(args.counters))
    else:
        query_df = (
            source.select("key", "payload")
            .groupBy("key")
            .applyInPandasWithState(
                _smallest_function(),
                outputStructType="key long, count long, s0 string, s1 string, s2 string",
                stateStructType="count long, s0 string, s1 string, s2 string",
                outputMode="update",
                timeoutConf=GroupStateTimeout.NoTimeout,
            )
        )
    sink = SqliteSink(run_dir / "sink" / "sink.db", args.workload, args.counters)
    writer = (
        query_df.writeStream.outputMode("update")
        .option("checkpointLocation", str(run_dir / "checkpoint"))
        .foreachBatch(sink)
        .queryName(args.workload)
    )
    if opts.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{opts.trigger_seconds} seconds")
    query = writer.start()
    query_started = time.time()
    seen_batches: set[int] = set()
    rows_done = 0
    while query.isActive and rows_done < args.rows:
        time.sleep(0.2)
        for progress in query.recentProgress:
            if progress["batchId"] in seen_batches or not progress["numInputRows"]:
                continue
            seen_batches.add(progress["batchId"])
            rows_done += progress["numInputRows"]
            seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
            print(
                f"    spark batch {progress['batchId']}: {progress['numInputRows']:,} rows "
                f"in {seconds:.2f} s; {rows_done:,}/{args.rows:,} rows, "
                f"{time.time() - args.launch:.1f} s since launch",
                flush=True,
            )
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    if opts.trigger == "available-now":
        query.awaitTermination()
    progresses = [p for p in query.recentProgress if p["numInputRows"]]
    query.stop()
    stopped = time.time()
    spark.stop()
    batches = []
    for p in progresses:
        start = _epoch(p["timestamp"])
        batches.append(
            {
                "batch_id": p["batchId"],
                "rows": p["numInputRows"],
                "start": start,
                "end": start + p["durationMs"]["triggerExecution"] / 1000,
                "duration_ms": p["durationMs"],
                "state": [
                    {k: op.get(k) for k in ("numRowsTotal", "numRowsUpdated", "memoryUsedBytes")}
                    for op in p.get("stateOperators", [])
                ],
            }
        )
    out = {
        "started": started,
        "session_ready": session_ready,
        "query_started": query_started,
        "stopped": stopped,
        "batches": batches,
        "sink": sink.applied,
        "driver_pid": os.getpid(),
    }
    (run_dir / "child.json").write_text(json.dumps(out, indent=2))


# --------------------------------------------------------------------------- parent process


def _classify(driver_pid: int) -> Callable[[ProcessIO], str]:
    def classify(p: ProcessIO) -> str:
        if p.pid == driver_pid:
            return "driver"
        if p.name == "java":
            return "jvm"
        if p.name.startswith("python"):
            return "python_workers"
        return "other"

    return classify


def read_sink(path: Path, workload: str, counters: int = 1) -> pa.Table:
    """The sink's result table."""
    con = sqlite3.connect(path)
    try:
        if workload == "keyed_sum":
            rows = con.execute("SELECT key, total FROM result ORDER BY key").fetchall()
            names = ["key", "total"]
        elif workload == "counters":
            names = ["key", *counter_names(counters)]
            rows = con.execute(f"SELECT {', '.join(names)} FROM result ORDER BY key").fetchall()
        else:
            rows = con.execute("SELECT key, count, s0, s1, s2 FROM result ORDER BY key").fetchall()
            names = ["key", "count", "s0", "s1", "s2"]
    finally:
        con.close()
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    return pa.table({n: list(c) for n, c in zip(names, columns, strict=True)})


def measure(
    workload: Workload,
    kind: str,
    opts: SparkOptions,
    run_dir: Path | None = None,
    *,
    counters: int = 1,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Run one workload through Spark in a measured child process and verify every key.

    Args:
        workload: The generated input.
        kind: ``keyed_sum``, ``smallest`` or ``counters``.
        opts: Spark settings.
        run_dir: Scratch directory (checkpoint, sink, local dirs); wiped first.
        counters: Counters per key of the ``counters`` workload.
        log: Progress output.

    Returns:
        The measured figures; ``verified["ok"]`` says whether every key matched.
    """
    if kind not in WORKLOADS:
        raise ValueError(f"unknown workload {kind!r}; choose from {WORKLOADS}")
    run_dir = run_dir or RESULTS / "spark" / "runs" / f"{kind}-{workload.spec.rows}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    for sub in ("sink", "tmp", "spark-local", "checkpoint"):
        (run_dir / sub).mkdir(parents=True)
    if kind == "counters":
        expected = workload.expected_counters(counters)
    elif kind == "keyed_sum":
        expected = workload.expected_sum()
    else:
        expected = workload.expected_smallest()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    load_before = loadavg()
    launch = time.time()
    args = [
        sys.executable,
        "-m",
        "bench.spark_structured_streaming",
        "--child",
        "--workload",
        kind,
        "--input",
        str(workload.path),
        "--rows",
        str(workload.spec.rows),
        "--run-dir",
        str(run_dir),
        "--launch",
        repr(launch),
        "--options",
        json.dumps(opts.__dict__),
        "--counters",
        str(counters),
    ]
    dirs = {
        "checkpoint": run_dir / "checkpoint",
        "spark_local": run_dir / "spark-local",
        "tmp": run_dir / "tmp",
    }

    def progress(meter: Any) -> None:
        if int(time.time() - launch) % 10 == 0:
            report = meter.report()
            log(
                f"    [{time.time() - launch:5.0f} s] {len(report.processes)} processes, "
                f"{report.write_bytes / 1e6:,.1f} MB written so far"
            )

    with DirectoryMeter(dirs, interval=0.5) as dir_meter:
        status, report = run_subprocess(args, env=env, cwd=str(REPO), on_sample=progress)
        dir_bytes = dir_meter.stop()
        state_bytes = dir_meter.bytes_seen("state")["checkpoint"]
    if status != 0:
        raise RuntimeError(f"Spark child failed with status {status}; see its output above")
    child = json.loads((run_dir / "child.json").read_text())
    groups = report.group(_classify(child["driver_pid"]))
    log(f"    verifying {expected.num_rows:,} keys")
    verification = compare(expected, read_sink(run_dir / "sink" / "sink.db", kind, counters))
    driver = groups.get("driver", {}).get("write_bytes", 0)
    jvm = groups.get("jvm", {}).get("write_bytes", 0)
    written = {
        "total": report.write_bytes,
        "net": report.net_write_bytes,
        "output": driver,
        "state": report.write_bytes - driver,
        "jvm": jvm,
        "python_workers": groups.get("python_workers", {}).get("write_bytes", 0),
        "checkpoint_files": dir_bytes["checkpoint"],
        "checkpoint_state_files": state_bytes,
        "shuffle_files": dir_bytes["spark_local"],
        "tmp_files": dir_bytes["tmp"],
        "wchar": report.wchar,
        "wait4_oublock": report.wait4_oublock_bytes or 0,
        "sink_db_size": sum(f.stat().st_size for f in (run_dir / "sink").iterdir() if f.is_file()),
    }
    batches = [
        BatchRecord(b["batch_id"], b["rows"], b["start"], b["end"]) for b in child["batches"]
    ]
    if sum(b.rows for b in batches) != workload.spec.rows:
        raise RuntimeError(
            f"Spark reported {sum(b.rows for b in batches):,} input rows, "
            f"expected {workload.spec.rows:,}"
        )
    return RunResult(
        system="spark",
        workload=kind,
        rows=workload.spec.rows,
        input_bytes=workload.input_bytes,
        parquet_bytes=workload.parquet_bytes,
        launch=launch,
        batches=batches,
        written=written,
        peak_rss_bytes=report.peak_rss_bytes,
        peak_pss_bytes=report.peak_pss_bytes,
        cpu_seconds=report.cpu_seconds,
        verified={"ok": verification.ok, "summary": verification.summary()},
        settings={
            **opts.__dict__,
            "rows_per_file": workload.spec.rows_per_file,
            "partitions": workload.spec.partitions,
            "session_ready_s": child["session_ready"] - launch,
            "query_started_s": child["query_started"] - launch,
            "stopped_s": child["stopped"] - launch,
            "processes": {k: v["processes"] for k, v in groups.items()},
            "process_writes": [
                {"name": p.name, "cmd": p.cmdline[:100], "write_bytes": p.written}
                for p in report.processes
                if p.written
            ],
            "state_operators_last": child["batches"][-1]["state"] if child["batches"] else [],
        },
        load=[load_before, loadavg()],
    )


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``SparkOptions`` fields as command-line options."""
    d = SparkOptions()
    parser.add_argument("--cores", type=int, default=d.cores)
    parser.add_argument("--max-files-per-trigger", type=int, default=d.max_files_per_trigger)
    parser.add_argument("--shuffle-partitions", type=int, default=d.shuffle_partitions)
    parser.add_argument(
        "--trigger", choices=["processing-time", "available-now"], default=d.trigger
    )
    parser.add_argument("--trigger-seconds", type=float, default=d.trigger_seconds)
    parser.add_argument("--driver-memory", default=d.driver_memory)
    parser.add_argument("--state-store", choices=["hdfs", "rocksdb"], default=d.state_store)


def options_from_args(args: argparse.Namespace) -> SparkOptions:
    """A ``SparkOptions`` from options added by :func:`add_spark_arguments`."""
    return SparkOptions(
        cores=args.cores,
        max_files_per_trigger=args.max_files_per_trigger,
        shuffle_partitions=args.shuffle_partitions,
        trigger=args.trigger,
        trigger_seconds=args.trigger_seconds,
        driver_memory=args.driver_memory,
        state_store=args.state_store,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="keyed_sum")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--launch", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument(
        "--counters",
        type=int,
        choices=COUNTER_CHOICES,
        default=1,
        help="counters per key (workload counters)",
    )
    add_spec_arguments(parser)
    add_spark_arguments(parser)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    workload = generate(spec_from_args(args), args.data_root, verbose=True)
    result = measure(workload, args.workload, options_from_args(args), counters=args.counters)
    result.save(RESULTS / "spark" / f"{args.workload}-{workload.spec.rows}.json")
    print_result(result)
    if not result.verified["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
