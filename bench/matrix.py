"""The benchmark matrix: natural jobs in the shapes users vary, millstream against Spark.

Every cell runs the job the README teaches with default :class:`millstream.Tuning` and
verifies every key; Spark Structured Streaming runs the same query on the same data in the
same invocation. What varies (issue 15):

* ``counters``: counters per key (1, 2, 4; :mod:`bench.counters`);
* ``layout``: the reducers' output keys in one keyspace (``shared``) or each reducer's
  under its own index (``grouped``); Spark has one result table either way;
* ``keys``: key cardinality (1,000; 100,000; 10 million);
* rows: ``--rows`` and ``--marginal-rows`` (the marginal rate between them);
* plus the non-combinable ``smallest`` workload (every row crosses the shuffle).

Figures per cell, each as millstream, Spark and their ratio, against the targets:

* whole-run rows/s at ``--rows``: rows over process start to the last commit (target:
  at least 6x Spark's);
* marginal rate: ``(marginal_rows - rows) / (wall at marginal_rows - wall at rows)``
  (target: at least 2x);
* bytes written per logical input byte, at both sizes: everything the process tree wrote
  (target: at most half of Spark's).

Spark runs once per (keys, counters, rows): its query does not depend on the layout.

Run (about 30 minutes for the full matrix on two cores)::

    .venv/bin/python -m bench.matrix
    .venv/bin/python -m bench.matrix --keys 100000 --counters 4 --systems millstream
    .venv/bin/python -m bench.matrix --table-only      # the table of the cells measured
    .venv/bin/python -m bench.matrix --systems millstream --store fdb:///tmp/fdb/fdb.cluster \
        --store-pid "$(cat /tmp/fdb/fdbserver.pid)"     # the state on FoundationDB

Raw results: ``bench/results/matrix/<cell>.json``; the table also goes to
``bench/results/matrix/table.md``. Exits with status 1 if any run gave a wrong result.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import millstream_runner, spark_structured_streaming
from bench.counters import CHOICES
from bench.millstream_jobs import LAYOUTS
from bench.result import RunResult
from bench.workload import Workload, WorkloadSpec, generate

RESULTS = Path(__file__).resolve().parent / "results" / "matrix"
SYSTEMS = ("spark", "millstream")
WHOLE_TARGET = 6.0
MARGINAL_TARGET = 2.0
BYTES_TARGET = 0.5


def log(message: str) -> None:
    """Progress output, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass(frozen=True)
class Cell:
    """One measured run: a system, a job shape and a size."""

    system: str
    workload: str
    keys: int
    rows: int
    counters: int = 1
    layout: str = ""

    @property
    def name(self) -> str:
        """File name of its result: ``<system>-<workload>-k<keys>-c<n>[-<layout>]-r<rows>``."""
        layout = f"-{self.layout}" if self.layout else ""
        return f"{self.system}-{self.workload}-k{self.keys}-c{self.counters}{layout}-r{self.rows}"


@dataclass(frozen=True)
class Shape:
    """One row of the table: a job shape, measured at two sizes by both systems."""

    workload: str
    keys: int
    counters: int
    layout: str

    @property
    def label(self) -> str:
        """How the table names it."""
        if self.workload == "smallest":
            return f"smallest, {self.keys:,} keys"
        return f"{self.counters} counter(s), {self.layout}, {self.keys:,} keys"

    def cell(self, system: str, rows: int) -> Cell:
        """The run of ``system`` at ``rows`` (Spark's runs ignore the layout)."""
        layout = self.layout if system == "millstream" else ""
        return Cell(system, self.workload, self.keys, rows, self.counters, layout)


def shapes(args: argparse.Namespace) -> Iterator[Shape]:
    """The table's rows, in the order they run."""
    for keys in args.keys:
        for counters in args.counters:
            for layout in args.layouts:
                yield Shape("counters", keys, counters, layout)
    if args.smallest_rows:
        yield Shape("smallest", args.smallest_keys, 1, "grouped")


def _sizes(shape: Shape, args: argparse.Namespace) -> tuple[int, int]:
    if shape.workload == "smallest":
        return args.smallest_rows, args.smallest_marginal_rows
    return args.rows, args.marginal_rows


def result_path(cell: Cell, args: argparse.Namespace) -> Path:
    """Where a cell's result is saved: ``<cell>.json``, or ``<cell>-<scheme>.json`` for a
    millstream cell on ``--store`` (``-fdb`` for FoundationDB)."""
    store = f"-{args.store.split(':', 1)[0]}" if args.store and cell.system != "spark" else ""
    return RESULTS / f"{cell.name}{store}.json"


def run_cell(cell: Cell, workload: Workload, args: argparse.Namespace) -> RunResult:
    """Measure one cell (or load it with ``--resume``) and save it."""
    path = result_path(cell, args)
    if args.resume and path.exists():
        log(f"{cell.name}: kept from an earlier run")
        return RunResult.load_json(path)
    log(f"{cell.name}: starting")
    if cell.system == "spark":
        opts = spark_structured_streaming.SparkOptions(
            max_files_per_trigger=(
                args.smallest_files_per_trigger
                if cell.workload == "smallest"
                else args.spark_files_per_trigger
            ),
            driver_memory=args.spark_driver_memory,
        )
        result = spark_structured_streaming.measure(
            workload, cell.workload, opts, counters=cell.counters, log=log
        )
    else:
        mopts = millstream_runner.MillstreamOptions(
            bookkeeping_run=False,
            counters=cell.counters,
            layout=cell.layout or "shared",
            store=args.store,
            store_pids=tuple(args.store_pid),
        )
        result = millstream_runner.measure(workload, cell.workload, mopts, log=log)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.save(path)
    written = result.per_input_byte("total")
    log(
        f"{cell.name}: {result.wall_seconds:.2f} s, {result.cpu_seconds:.2f} CPU s, "
        f"{len(result.batches)} commits, "
        f"{written:.4f} bytes written per input byte, "
        f"{'exact' if result.verified['ok'] else 'WRONG: ' + str(result.verified['summary'])}"
    )
    return result


def _marginal(small: RunResult, large: RunResult) -> float:
    seconds = large.wall_seconds - small.wall_seconds
    return (large.rows - small.rows) / seconds if seconds > 0 else math.nan


def _ratio(value: float, against: float) -> float:
    return value / against if against and not math.isnan(against) else math.nan


def _mark(text: str, ok: bool) -> str:
    return text if ok else f"**{text}**"


def table(results: dict[Cell, RunResult], shape_list: list[Shape], args: argparse.Namespace) -> str:
    """The markdown table: per shape, both systems' figures and the ratios; misses in bold."""
    lines = [
        f"Targets: whole-run rows/s at least {WHOLE_TARGET:g}x Spark's, marginal rate at "
        f"least {MARGINAL_TARGET:g}x, bytes written at most {BYTES_TARGET:g}x; misses in "
        "bold. Rates in M rows/s; bytes per logical input byte (84 B rows).",
        "",
        "| job | rows | ms s | spark s | whole ratio | ms marginal | spark marginal | "
        "marginal ratio | ms B/B small | spark B/B small | ratio | ms B/B large | "
        "spark B/B large | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: |",
    ]
    for shape in shape_list:
        small_rows, large_rows = _sizes(shape, args)
        got = {
            (system, rows): results.get(shape.cell(system, rows))
            for system in SYSTEMS
            for rows in (small_rows, large_rows)
        }
        ms_small, sp_small = got[("millstream", small_rows)], got[("spark", small_rows)]
        ms_large, sp_large = got[("millstream", large_rows)], got[("spark", large_rows)]
        if ms_small is None:
            continue
        row = [shape.label, f"{small_rows / 1e6:g}M/{large_rows / 1e6:g}M"]
        row.append(f"{ms_small.wall_seconds:.2f}")
        row.append(f"{sp_small.wall_seconds:.2f}" if sp_small else "")
        whole = _ratio(sp_small.wall_seconds, ms_small.wall_seconds) if sp_small else math.nan
        row.append(_mark(f"{whole:.2f}", whole >= WHOLE_TARGET) if sp_small else "")
        ms_marginal = _marginal(ms_small, ms_large) if ms_large else math.nan
        sp_marginal = _marginal(sp_small, sp_large) if sp_small and sp_large else math.nan
        ratio = _ratio(ms_marginal, sp_marginal)
        row += [
            f"{ms_marginal / 1e6:.2f}" if ms_large else "",
            f"{sp_marginal / 1e6:.2f}" if sp_large and sp_small else "",
            _mark(f"{ratio:.2f}", ratio >= MARGINAL_TARGET) if not math.isnan(ratio) else "",
        ]
        for ms, sp in ((ms_small, sp_small), (ms_large, sp_large)):
            mine = ms.per_input_byte("total") if ms else math.nan
            theirs = sp.per_input_byte("total") if sp else math.nan
            ratio = _ratio(mine, theirs)
            row += [
                f"{mine:.4f}" if ms else "",
                f"{theirs:.4f}" if sp else "",
                _mark(f"{ratio:.2f}", ratio <= BYTES_TARGET) if not math.isnan(ratio) else "",
            ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _csv(kind: type, text: str) -> list:  # type: ignore[type-arg]
    return [kind(item) for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--systems", type=lambda t: _csv(str, t), default=list(SYSTEMS), help="spark,millstream"
    )
    parser.add_argument(
        "--keys",
        type=lambda t: _csv(int, t),
        default=[100_000, 1_000, 10_000_000],
        help="key cardinalities, comma-separated",
    )
    parser.add_argument(
        "--counters", type=lambda t: _csv(int, t), default=list(CHOICES), help="e.g. 1,2,4"
    )
    parser.add_argument(
        "--layouts", type=lambda t: _csv(str, t), default=list(LAYOUTS), help="shared,grouped"
    )
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--marginal-rows", type=int, default=20_000_000)
    parser.add_argument(
        "--smallest-rows", type=int, default=5_000_000, help="0: no smallest workload"
    )
    parser.add_argument("--smallest-marginal-rows", type=int, default=20_000_000)
    parser.add_argument("--smallest-keys", type=int, default=100_000)
    parser.add_argument("--spark-files-per-trigger", type=int, default=8)
    parser.add_argument(
        "--smallest-files-per-trigger",
        type=int,
        default=10,
        help="Spark's maxFilesPerTrigger for smallest (its state update is per key)",
    )
    parser.add_argument("--spark-driver-memory", default="8g")
    parser.add_argument(
        "--resume", action="store_true", help="reuse cells already in bench/results/matrix"
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="print the table of the cells already in bench/results/matrix; run nothing",
    )
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument(
        "--store",
        default=None,
        help="millstream's state store (fdb://<cluster file>, emptied before each run); "
        "default: SQLite in the run directory. Results go to <cell>-fdb.json",
    )
    parser.add_argument(
        "--store-pid",
        type=int,
        action="append",
        default=[],
        help="a process serving the store (fdbserver): its writes count (repeatable)",
    )
    args = parser.parse_args()
    for name in args.systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}; choose from {SYSTEMS}")
    for layout in args.layouts:
        if layout not in LAYOUTS:
            parser.error(f"unknown layout {layout!r}; choose from {LAYOUTS}")
    for n in args.counters:
        if n not in CHOICES:
            parser.error(f"counters per key must be among {CHOICES}, got {n}")

    shape_list = list(shapes(args))
    results: dict[Cell, RunResult] = {}
    wrong: list[str] = []
    workloads: dict[tuple[int, int], Workload] = {}

    def workload(keys: int, rows: int) -> Workload:
        if (keys, rows) not in workloads:
            spec = WorkloadSpec(rows=rows, keys=keys)
            extra = {} if args.data_root is None else {"root": args.data_root}
            log(f"data: {rows:,} rows over {keys:,} keys")
            workloads[(keys, rows)] = generate(spec, verbose=False, **extra)
        return workloads[(keys, rows)]

    for shape in shape_list:
        for rows in _sizes(shape, args):
            if not rows:
                continue
            for system in args.systems:
                cell = shape.cell(system, rows)
                if cell in results:
                    continue
                if args.table_only:
                    path = result_path(cell, args)
                    if path.exists():
                        results[cell] = RunResult.load_json(path)
                    continue
                result = run_cell(cell, workload(shape.keys, rows), args)
                results[cell] = result
                if not result.verified["ok"]:
                    wrong.append(cell.name)
        if not args.table_only:
            RESULTS.mkdir(parents=True, exist_ok=True)
            suffix = f"-{args.store.split(':', 1)[0]}" if args.store else ""
            (RESULTS / f"table{suffix}.md").write_text(table(results, shape_list, args))
    text = table(results, shape_list, args)
    print(text)
    if wrong:
        log(f"wrong results: {', '.join(wrong)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
