"""The physical floor of the ``counters`` job: one process, pyarrow only, no fault tolerance.

What the matrix's natural job (:mod:`bench.counters`, ``CountersIntoStore``) computes, done
the way a minimal honest batch job does it: read every Parquet file of the input's
``partition=<p>`` directories (only the columns the job reads, ``key`` and ``value``),
compute the counters per key with one group-by (:func:`bench.counters.query`, pyarrow's
threads on unless asked otherwise), and write the final per-key counters durably: one
SQLite transaction into a fresh database (WAL, ``synchronous=FULL``, so the commit is
fsync'd before it returns). Nothing else is persisted: no progress, no recovery; a crash
starts over from the first file. Every cost that remains is a cost any job on this data
pays, so millstream's rate is quoted as a ratio to this one (:mod:`bench.floor_ratio`).

Run as the measured child of :mod:`bench.floor_ratio`::

    python -m bench.floor <input dir> <run dir> <counters> [--single-thread]

It writes ``<run dir>/floor.db`` (table ``counters``: ``key`` and one column per counter)
and then ``<run dir>/floor.json``: the wall time of the commit, rows read, keys written.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from bench.counters import names, query

COLUMNS = ("key", "value")
"""The input columns the job reads (as ``ParquetLog(columns=...)`` in the matrix)."""
DATABASE = "floor.db"
SUMMARY = "floor.json"
TABLE = "counters"


def input_files(input_dir: Path) -> list[Path]:
    """Every Parquet file of the ``partition=<p>`` directories, partition by partition."""
    files = sorted(input_dir.glob("partition=*/*.parquet"))
    if not files:
        raise FileNotFoundError(
            f"no partition=<p>/*.parquet files under {input_dir}: generate the data with "
            "`python -m bench.workload --rows N` and pass the directory it prints"
        )
    return files


def write(path: Path, result: pa.Table) -> None:
    """``result`` (``key`` and counters) into a new SQLite database, one fsync'd transaction.

    Raises:
        FileExistsError: ``path`` exists (a floor run writes a fresh database, never into
            an earlier run's).
    """
    if path.exists():
        raise FileExistsError(f"{path} exists: remove it or give the floor a fresh run directory")
    counters = result.column_names[1:]
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        columns = ", ".join(f"{c} INTEGER NOT NULL" for c in counters)
        db.execute("BEGIN")
        db.execute(f"CREATE TABLE {TABLE} (key INTEGER PRIMARY KEY, {columns})")
        marks = ", ".join("?" * result.num_columns)
        rows = zip(*(column.to_pylist() for column in result.columns), strict=True)
        db.executemany(f"INSERT INTO {TABLE} VALUES ({marks})", rows)
        db.execute("COMMIT")
    finally:
        db.close()


def read(path: Path, n: int) -> pa.Table:
    """The counters a floor run wrote: ``key`` and the first ``n`` counters, by key."""
    counters = names(n)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(f"SELECT key, {', '.join(counters)} FROM {TABLE} ORDER BY key").fetchall()
    finally:
        db.close()
    columns = list(zip(*rows, strict=True)) if rows else [()] * (n + 1)
    return pa.table(
        {
            name: pa.array(values, pa.int64())
            for name, values in zip(("key", *counters), columns, strict=True)
        }
    )


def run(input_dir: Path, run_dir: Path, n: int, *, use_threads: bool = True) -> dict[str, Any]:
    """Read, aggregate and durably write the ``n``-counter job over ``input_dir``.

    Returns:
        ``committed`` (wall time right after the commit returned), ``rows`` read and
        ``keys`` written; also written to ``run_dir/floor.json``.
    """
    files = input_files(input_dir)
    table = ds.dataset([str(f) for f in files], format="parquet").to_table(
        columns=list(COLUMNS), use_threads=use_threads
    )
    result = query(table, n, use_threads=use_threads)
    write(run_dir / DATABASE, result)
    summary = {"committed": time.time(), "rows": table.num_rows, "keys": result.num_rows}
    (run_dir / SUMMARY).write_text(json.dumps(summary))
    return summary


def main(argv: list[str]) -> None:
    """``<input dir> <run dir> <counters> [--single-thread]``: one floor run."""
    if len(argv) < 3:
        raise SystemExit(__doc__)
    input_dir, run_dir, n = Path(argv[0]), Path(argv[1]), int(argv[2])
    run(input_dir, run_dir, n, use_threads="--single-thread" not in argv[3:])


if __name__ == "__main__":
    main(sys.argv[1:])
