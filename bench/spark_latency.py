"""Latency from append to sink commit in Spark Structured Streaming, at a fixed offered rate.

The Spark counterpart of :mod:`bench.latency`: a producer (this process) writes small
Parquet files of the same rows (int64 key over 100,000 keys, int64 value, 64-character
payload, plus the append time) into a directory at ``--rate`` rows/s, one file every
``--tick`` seconds, each made visible by an atomic rename; the query of
:mod:`bench.spark_structured_streaming` (file source, ``groupBy("key").sum("value")``,
output mode ``update``, checkpoint, idempotent ``foreachBatch`` SQLite sink, trigger
``processingTime=--trigger-seconds``, ``local[2]``) runs in a child process.

The append time of a file's rows is taken just before the file is written (as the
millstream producer stamps rows just before its append transaction). Which micro-batch
read which file comes from the file source's own log in the checkpoint
(``sources/0/<batch>``, compacted files included); the sink records when each batch's
SQLite transaction committed. The latency of a row is then exactly ``commit time of the
batch that read its file - its append time``. Figures are over files appended after
``--warmup`` seconds (the JVM's first batches are slow). Exactness: the sink's per-key
totals must equal the producer's own sums.

Run::

    .venv/bin/python -m bench.spark_latency --rate 62500 --seconds 60 --trigger-seconds 0

Raw results: ``bench/results/spark_latency/*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.latency_stats import fmt_ms, summarize_latency, timeline, weighted_slope
from bench.queue_pipeline import loadavg, log
from bench.queue_producer import _payload_pool
from bench.spark_structured_streaming import SparkOptions, SqliteSink, _build_session

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "spark_latency"
SCHEMA = pa.schema(
    [
        ("key", pa.int64()),
        ("value", pa.int64()),
        ("payload", pa.string()),
        ("append_ns", pa.int64()),
    ]
)


# --------------------------------------------------------------------------- child


def run_child(args: argparse.Namespace) -> None:
    """The streaming query; stops once the rows named in ``control/done`` are committed."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    run_dir = Path(args.run_dir)
    opts = SparkOptions(**json.loads(args.options))
    spark = _build_session(opts, run_dir)
    schema = StructType(
        [
            StructField("key", LongType(), False),
            StructField("value", LongType(), False),
            StructField("payload", StringType(), False),
            StructField("append_ns", LongType(), False),
        ]
    )
    source = spark.readStream.schema(schema).parquet(str(run_dir / "input"))
    sums = source.groupBy("key").agg(F.sum("value").alias("total"))
    sink = SqliteSink(run_dir / "sink" / "sink.db", "keyed_sum")
    writer = (
        sums.writeStream.outputMode("update")
        .option("checkpointLocation", str(run_dir / "checkpoint"))
        .foreachBatch(sink)
        .trigger(processingTime=f"{opts.trigger_seconds} seconds")
    )
    query = writer.start()
    (run_dir / "control" / "started").write_text(str(time.time()))
    done_file = run_dir / "control" / "done"
    while query.isActive:
        time.sleep(0.2)
        # An idle trigger reports the next batch id with 0 rows: count each id's largest.
        per_batch: dict[int, int] = {}
        for p in query.recentProgress:
            per_batch[p["batchId"]] = max(per_batch.get(p["batchId"], 0), p["numInputRows"])
        if done_file.exists() and sum(per_batch.values()) >= int(done_file.read_text()):
            break
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    progress = [
        {
            "batch_id": p["batchId"],
            "rows": p["numInputRows"],
            "timestamp": p["timestamp"],
            "duration_ms": p["durationMs"],
        }
        for p in query.recentProgress
        if p["numInputRows"]
    ]
    query.stop()
    spark.stop()
    (run_dir / "child.json").write_text(json.dumps({"sink": sink.applied, "progress": progress}))


# --------------------------------------------------------------------------- parent


def file_batches(checkpoint: Path) -> dict[str, int]:
    """File name -> id of the micro-batch that read it, from the file source's log."""
    out: dict[str, int] = {}
    log_dir = checkpoint / "sources" / "0"
    for path in sorted(log_dir.iterdir()):
        if path.name.startswith("."):
            continue
        for line in path.read_text().splitlines():
            if not line.startswith("{"):
                continue  # the "v1" version line
            entry = json.loads(line)
            out[Path(entry["path"]).name] = int(entry["batchId"])
    return out


def _produce(
    input_dir: Path, rate: float, seconds: float, tick: float, keys: int, seed: int
) -> tuple[list[dict[str, Any]], np.ndarray, int]:
    rng = np.random.default_rng(seed)
    pool = _payload_pool(rng, 1 << 17)
    sums = np.zeros(keys, np.int64)
    rows_per_file = max(1, round(rate * tick))
    interval = rows_per_file / rate
    files: list[dict[str, Any]] = []
    staging = input_dir.parent / "staging"
    staging.mkdir(exist_ok=True)
    t0 = time.monotonic()
    due = t0
    offset = 0
    while due < t0 + seconds:
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        n = rows_per_file
        key = rng.integers(0, keys, n, dtype=np.int64)
        value = rng.integers(0, 1_000_000, n, dtype=np.int64)
        if offset + n > len(pool):
            offset = 0
        stamp = time.time_ns()
        table = pa.table(
            [pa.array(key), pa.array(value), pool.slice(offset, n), pa.array(np.full(n, stamp))],
            schema=SCHEMA,
        )
        offset += n
        name = f"part-{len(files):06d}.parquet"
        pq.write_table(table, staging / name, compression="none")
        os.rename(staging / name, input_dir / name)
        np.add.at(sums, key, value)
        files.append({"name": name, "append": stamp / 1e9, "rows": n})
        due += interval
    return files, sums, rows_per_file


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the child query, produce at the fixed rate, and compute the figures."""
    label = f"spark-{args.rate:.0f}-trigger{args.trigger_seconds:g}{args.tag}"
    run_dir = RESULTS / "runs" / label
    if run_dir.exists():
        shutil.rmtree(run_dir)
    for sub in ("input", "sink", "tmp", "spark-local", "checkpoint", "control"):
        (run_dir / sub).mkdir(parents=True)
    opts = SparkOptions(trigger_seconds=args.trigger_seconds, shuffle_partitions=2)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    load_before = loadavg()
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.spark_latency",
            "--child",
            "--run-dir",
            str(run_dir),
            "--options",
            json.dumps(opts.__dict__),
        ],
        env=env,
        cwd=str(REPO),
    )
    try:
        while not (run_dir / "control" / "started").exists():
            if child.poll() is not None:
                raise RuntimeError(f"the Spark child exited with {child.returncode}")
            time.sleep(0.2)
        log(f"{label}: query started; producing {args.rate:,.0f} rows/s for {args.seconds:g} s")
        files, sums, rows_per_file = _produce(
            run_dir / "input", args.rate, args.seconds, args.tick, args.keys, args.seed
        )
        total = sum(f["rows"] for f in files)
        (run_dir / "control" / "done").write_text(str(total))
        log(f"  produced {total:,} rows in {len(files):,} files; waiting for the query")
        child.wait(timeout=900)
    finally:
        if child.poll() is None:
            child.kill()
    if child.returncode != 0:
        raise RuntimeError(f"the Spark child failed with {child.returncode}")
    out = json.loads((run_dir / "child.json").read_text())
    commits = {int(a["batch_id"]): float(a["end"]) for a in out["sink"]}
    batch_of = file_batches(run_dir / "checkpoint")
    append = np.array([f["append"] for f in files])
    rows = np.array([f["rows"] for f in files], dtype=np.float64)
    commit = np.array([commits.get(batch_of.get(f["name"], -1), np.nan) for f in files])
    if np.isnan(commit).any():
        raise RuntimeError(f"{int(np.isnan(commit).sum())} files have no committed batch")
    latency = commit - append
    start = append[0]
    steady = append >= start + args.warmup
    con = sqlite3.connect(run_dir / "sink" / "sink.db")
    try:
        got = np.zeros(args.keys, np.int64)
        for key, value in con.execute("SELECT key, total FROM result"):
            got[key] = value
    finally:
        con.close()
    mismatched = int((got != sums).sum())
    durations = [p["duration_ms"].get("triggerExecution", 0) / 1000 for p in out["progress"]]
    result = {
        "label": label,
        "offered_rate": args.rate,
        "rows": total,
        "files": len(files),
        "rows_per_file": rows_per_file,
        "latency": summarize_latency(latency[steady], rows[steady]),
        "whole": summarize_latency(latency, rows),
        "slope": weighted_slope(append[steady], latency[steady], rows[steady]),
        "batches": len(commits),
        "batch_seconds_median": float(np.median(durations)) if durations else None,
        "timeline": timeline(append, latency, rows, start=start),
        "verified": {
            "ok": mismatched == 0,
            "keys_mismatched": mismatched,
            "summary": f"{args.keys - mismatched:,}/{args.keys:,} key totals equal the producer's",
        },
        "settings": {
            **opts.__dict__,
            "tick_s": args.tick,
            "seconds": args.seconds,
            "warmup_s": args.warmup,
        },
        "load": [load_before, loadavg()],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{label}.json").write_text(json.dumps(result, indent=2, default=float))
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    lat = result["latency"]
    log(
        f"{label}: latency p50 {fmt_ms(lat['p50'])} ms, p90 {fmt_ms(lat['p90'])}, p99 "
        f"{fmt_ms(lat['p99'])}, p99.9 {fmt_ms(lat['p99.9'])}, max {fmt_ms(lat['max'])}; "
        f"{result['batches']} batches (median {result['batch_seconds_median']:.2f} s); slope "
        f"{result['slope']:.3f} s/s; {result['verified']['summary']}; load {result['load']}"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=62_500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between files")
    parser.add_argument("--trigger-seconds", type=float, default=0.0)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--tag", default="")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    args.tag = f"-{args.tag}" if args.tag else ""
    result = measure(args)
    if not result["verified"]["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
