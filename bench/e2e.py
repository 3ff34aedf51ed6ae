"""End-to-end benchmark: the workloads through each system, side by side, as a markdown table.

Workloads (see :mod:`bench.workload`): ``keyed_sum`` (sum of value per key) and
``smallest`` (per key the count and three smallest payloads). Systems: ``spark`` (Spark
Structured Streaming, :mod:`bench.spark_structured_streaming`), ``millstream``
(:mod:`bench.millstream_runner`, the local runner) and ``millstream-spark`` (the same
processor on millstream's Spark runner). Every run is
verified key by key; the process exits with status 1 if a run is wrong or a requested
system is unavailable, after printing the table.

The marginal rate of ``keyed_sum``: ``(rows_large - rows) / (wall_large - wall)``, from a
second run at ``--marginal-rows`` (0 to skip): what a system sustains once its fixed costs
(start-up, first batch) are paid. The table also gives the same rate within the large run
alone (after the batch that reached ``--rows``), which start-up noise does not move. With
``--repeat``, each figure is from the run of median wall time (all runs are saved).

Run::

    .venv/bin/python -m bench.e2e --systems spark --rows 5000000 --marginal-rows 20000000

Raw results: ``bench/results/e2e/<system>-<workload>-<rows>.json``; the table is also
written to ``bench/results/e2e/table.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import millstream_runner, spark_structured_streaming
from bench.result import MB, RunResult, loadavg, print_result
from bench.workload import Workload, add_spec_arguments, generate, spec_from_args

RESULTS = Path(__file__).resolve().parent / "results" / "e2e"
SYSTEMS = ("spark", "millstream", "millstream-spark")
"""Spark Structured Streaming; millstream with its local runner; millstream with its Spark
runner (every worker a task of one Spark job)."""
WORKLOADS = spark_structured_streaming.WORKLOADS


def log(message: str) -> None:
    """Progress output, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _parse_per_workload(text: str) -> dict[str, int]:
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in WORKLOADS:
            raise argparse.ArgumentTypeError(f"unknown workload {name!r} in {text!r}")
        out[name] = int(value)
    return out


def run_median(system: str, workload: Workload, kind: str, args: argparse.Namespace) -> RunResult:
    """``--repeat`` runs of one system, workload and size; the one of median wall time."""
    repeat = max(1, args.repeat.get(kind, 1))
    runs = []
    for attempt in range(repeat):
        result = run_one(system, workload, kind, args, f"run {attempt + 1}/{repeat}")
        result.save(RESULTS / f"{system}-{kind}-{workload.spec.rows}-run{attempt + 1}.json")
        runs.append(result)
    runs.sort(key=lambda r: r.wall_seconds)
    chosen = runs[(len(runs) - 1) // 2]
    chosen.settings["repeat_walls_s"] = [round(r.wall_seconds, 2) for r in runs]
    chosen.save(RESULTS / f"{system}-{kind}-{workload.spec.rows}.json")
    return chosen


def run_one(
    system: str, workload: Workload, kind: str, args: argparse.Namespace, label: str = ""
) -> RunResult:
    """One system, one workload, one size."""
    log(f"{system} {kind} {workload.spec.rows:,} rows {label}: starting")
    if system == "spark":
        opts = spark_structured_streaming.options_from_args(args)
        files = args.spark_max_files.get(kind)
        if files:
            opts = spark_structured_streaming.SparkOptions(
                **{**opts.__dict__, "max_files_per_trigger": files}
            )
        result = spark_structured_streaming.measure(workload, kind, opts, log=log)
    else:
        runner = "spark" if system == "millstream-spark" else "local"
        mill_opts = dataclasses.replace(millstream_runner.options_from_args(args), runner=runner)
        result = millstream_runner.measure(workload, kind, mill_opts, log=log)
    print_result(result, log)
    return result


def _fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


COLUMNS: list[tuple[str, Callable[[RunResult], float], int]] = [
    ("rows/s (M), whole run", lambda r: r.rows_per_second / 1e6, 3),
    ("rows/s (M), once running", lambda r: r.running_rows_per_second / 1e6, 3),
    ("MB/s, whole run", lambda r: r.mb_per_second, 1),
    ("first commit (s)", lambda r: r.first_commit_seconds, 1),
    ("wall (s)", lambda r: r.wall_seconds, 1),
    ("median batch (s)", lambda r: r.summary()["batch_s_median"], 2),
    ("batches", lambda r: len(r.batches), 0),
    ("written / input byte", lambda r: r.per_input_byte("total"), 3),
    ("state / input byte", lambda r: r.per_input_byte("state"), 3),
    ("output / input byte", lambda r: r.per_input_byte("output"), 3),
    ("peak RSS (MB)", lambda r: r.peak_rss_bytes / MB, 0),
]


def within_run_rate(large: RunResult, rows: int) -> float:
    """Rows after the first batch that reached ``rows`` over the time after it, in one run.

    The same quantity as the marginal rate without the run-to-run noise of start-up times
    (on a shared machine the first batch alone varies by seconds).
    """
    done = 0
    for batch in large.batches:
        done += batch.rows
        if done >= rows:
            if batch is large.batches[-1]:
                return float("nan")
            return (large.rows - done) / (large.end - batch.end)
    return float("nan")


def table(
    results: dict[tuple[str, str, int], RunResult],
    failures: dict[tuple[str, str, int], str],
    rows: int,
    marginal_rows: int,
) -> str:
    """The markdown report: one row per (workload, system), ratios, marginal rates."""
    header = ["workload", "system", "rows", "runs", "exact", *(c[0] for c in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in WORKLOADS:
        for system in SYSTEMS:
            key = (system, kind, rows)
            if key in results:
                r = results[key]
                runs = len(r.settings.get("repeat_walls_s", [1]))
                cells = [kind, system, f"{r.rows:,}", str(runs)]
                cells.append("yes" if r.verified["ok"] else "**NO**")
                cells += [_fmt(fn(r), digits) for _, fn, digits in COLUMNS]
            elif key in failures:
                cells = [kind, system, f"{rows:,}", "", failures[key]] + [""] * len(COLUMNS)
            else:
                continue
            lines.append("| " + " | ".join(cells) + " |")
        spark = results.get(("spark", kind, rows))
        for system in SYSTEMS[1:]:
            mill = results.get((system, kind, rows))
            if spark and mill:
                cells = [kind, f"{system} / spark", "", "", ""]
                cells += [_fmt(fn(mill) / fn(spark), 2) for _, fn, _ in COLUMNS]
                lines.append("| " + " | ".join(cells) + " |")
    if marginal_rows:
        lines += [
            "",
            f"Marginal rate, keyed_sum: ({marginal_rows:,} - {rows:,}) rows / "
            f"(wall at {marginal_rows:,} - wall at {rows:,})",
            "",
            "| system | wall small (s) | wall large (s) | marginal rows/s (M) "
            "| within the large run (M) |",
            "|---|---|---|---|---|",
        ]
        rates = {}
        for system in SYSTEMS:
            small = results.get((system, "keyed_sum", rows))
            large = results.get((system, "keyed_sum", marginal_rows))
            if small and large:
                rates[system] = (marginal_rows - rows) / (large.wall_seconds - small.wall_seconds)
                lines.append(
                    f"| {system} | {small.wall_seconds:.1f} | {large.wall_seconds:.1f} "
                    f"| {rates[system] / 1e6:.3f} | {_fmt(within_run_rate(large, rows) / 1e6, 3)} |"
                )
        for system in SYSTEMS[1:]:
            if system in rates and "spark" in rates:
                ratio = rates[system] / rates["spark"]
                lines.append(f"| {system} / spark | | | {ratio:.2f} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--systems",
        default="spark,millstream,millstream-spark",
        help="comma-separated: spark,millstream,millstream-spark",
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated: keyed_sum,smallest"
    )
    parser.add_argument(
        "--marginal-rows",
        type=int,
        default=20_000_000,
        help="second keyed_sum size for the marginal rate (0: skip)",
    )
    parser.add_argument(
        "--spark-max-files",
        type=_parse_per_workload,
        default=_parse_per_workload("keyed_sum=8,smallest=10"),
        help="maxFilesPerTrigger per workload, e.g. keyed_sum=8,smallest=10",
    )
    parser.add_argument(
        "--repeat",
        type=_parse_per_workload,
        default=_parse_per_workload("keyed_sum=1,smallest=1"),
        help="runs per workload, the median by wall time is reported, e.g. keyed_sum=3",
    )
    add_spec_arguments(parser)
    spark_structured_streaming.add_spark_arguments(parser)
    millstream_runner.add_millstream_arguments(parser)
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    kinds = [w for w in args.workloads.split(",") if w]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}; choose from {SYSTEMS}")
    for name in kinds:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r}; choose from {WORKLOADS}")

    log(f"load before: {loadavg()}")
    results: dict[tuple[str, str, int], RunResult] = {}
    failures: dict[tuple[str, str, int], str] = {}
    sizes = [args.rows]
    if args.marginal_rows and "keyed_sum" in kinds:
        sizes.append(args.marginal_rows)
    for rows in sizes:
        log(f"workload data: {rows:,} rows")
        workload = generate(spec_from_args(args, rows), args.data_root, verbose=True)
        for kind in kinds if rows == args.rows else ["keyed_sum"]:
            (workload.expected_sum if kind == "keyed_sum" else workload.expected_smallest)()
            for system in systems:
                key = (system, kind, rows)
                try:
                    results[key] = run_median(system, workload, kind, args)
                except millstream_runner.MillstreamUnavailable as exc:
                    log(f"{system} {kind}: {exc}")
                    failures[key] = "not available yet"
    log(f"load after: {loadavg()}")
    text = table(results, failures, args.rows, args.marginal_rows if "keyed_sum" in kinds else 0)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text + "\n")
    print()
    print(text)
    wrong = [k for k, r in results.items() if not r.verified["ok"]]
    if wrong or failures:
        print(f"\nwrong results: {wrong}; unavailable: {sorted(failures)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
