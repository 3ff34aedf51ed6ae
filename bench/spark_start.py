"""The Spark runner's start, step by step: where the time from ``SparkSession`` to the
first reducer commit goes.

Runs the benchmark's ``keyed_sum`` through :mod:`bench.millstream_child` with the Spark
runner (``local[mappers + reducers]``) ``--repeat`` times and prints, per step, the median
wall seconds since the session was up. The steps come from three clocks on this machine:
the child's events (session up, :func:`millstream.spark.run` returned), Spark's event log
(job submitted, tasks launched) and the workers' events (:mod:`bench.millstream_jobs`:
when the task's Python worker process and its parent, PySpark's daemon, started; when the
mapper or reducer was constructed, i.e. imports done, store open and processor checked;
the first ``map``; the first rows a reducer got; its first commit).

With ``--compare-local``, it measures instead the rate once running: the same job with one
mapper and one reducer through the local runner and through the Spark runner on
``local[2]``, in turns, and prints each run's rows/s after the first commit (input rows
committed after it over the time from it to the last commit) and the CPU seconds of the
whole process tree.

Run::

    .venv/bin/python -m bench.spark_start --rows 5000000 --repeat 3
    .venv/bin/python -m bench.spark_start --daemon-module millstream.spark.daemon
    .venv/bin/python -m bench.spark_start --compare-local --rows 20000000 --repeat 3

``--daemon-module`` sets ``spark.python.daemon.module`` for the session. With ``--floor``,
each run is preceded by one of the floor (:mod:`bench.spark_floor`: the simplest Python
job's first commit, on the same session with PySpark's own daemon), and the two timelines
are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.millstream_runner import REPO, RESULTS, MillstreamOptions, run_child
from bench.pipeline_args import tuning_overrides
from bench.workload import add_spec_arguments, generate, spec_from_args

STEPS = (
    "job submitted",
    "first task launched",
    "last task launched",
    "PySpark daemon started",
    "first Python worker forked",
    "last Python worker forked",
    "mappers constructed",
    "reducers constructed",
    "first map",
    "first rows at a reducer",
    "first reducer commit",
)
"""The steps of the timeline, in the order they happen."""
CPU_STEPS = (
    "CPU s of PySpark's daemon when the workers were constructed",
    "CPU s of a worker from its fork to constructed (median of the 4)",
    "CPU s of the whole run (JVM, daemon, workers, driver)",
)
"""Not steps: what the daemon took (its imports), what a worker's process took to unpickle
its task, import and open the store, and the whole run's CPU."""
FLOOR_STEPS = {
    "job submitted": "job submitted",
    "first task launched": "first task launched",
    "last task launched": "last task launched",
    "PySpark daemon started": "PySpark daemon started",
    "first Python worker forked": "first Python worker forked",
    "last Python worker forked": "last Python worker forked",
    "first task's function entered": "mappers constructed",
    "first commit": "first reducer commit",
}
"""The floor's steps, each with the step of millstream's timeline it stands beside."""


def spark_events(directory: Path) -> dict[str, float]:
    """Job submission and task launches (wall seconds) from Spark's event log."""
    tasks: list[float] = []
    submitted: list[float] = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name[0] != "."):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                submitted.append(event["Submission Time"] / 1000)
            elif kind == "SparkListenerTaskStart":
                tasks.append(event["Task Info"]["Launch Time"] / 1000)
    if not submitted or not tasks:
        raise RuntimeError(f"no job or task in Spark's event log under {directory}")
    # The last job is the processor's: the session runs no other.
    return {
        "job submitted": max(submitted),
        "first task launched": min(tasks),
        "last task launched": max(tasks),
    }


def timeline(events: list[dict[str, Any]], commits: list[dict[str, Any]]) -> dict[str, float]:
    """Each step's wall time, from the child's and the workers' events and the commits."""

    def times(name: str, field: str = "t") -> list[float]:
        return [e[field] for e in events if e["event"] == name]

    workers = [e for e in events if e["event"] in ("mapper", "reducer")]
    return {
        "session": min(times("session")),
        "PySpark daemon started": min(e["parent"] for e in workers),
        "first Python worker forked": min(e["forked"] for e in workers),
        "last Python worker forked": max(e["forked"] for e in workers),
        "mappers constructed": max(times("mapper")),
        "reducers constructed": max(times("reducer")),
        "first map": min(times("first map")),
        "first rows at a reducer": min(times("first rows")),
        "first reducer commit": min(c["t"] for c in commits),
    }


def measure_start(args: argparse.Namespace, run: int, log: Any = print) -> dict[str, float]:
    """One run's timeline, in seconds since the session was up."""
    workload = generate(spec_from_args(args), args.data_root, verbose=False)
    run_dir = RESULTS / "spark_start" / f"run-{run}"
    events_dir = run_dir.parent / f"events-{run}"
    conf = event_log_conf(events_dir)
    if args.daemon_module:
        conf["spark.python.daemon.module"] = args.daemon_module
    opts = MillstreamOptions(runner="spark", bookkeeping_run=False)
    child = run_child(
        workload,
        "keyed_sum",
        opts,
        run_dir,
        write_output=True,
        log=log,
        extra={"spark_conf": conf, "tuning": tuning_overrides(args.tuning)},
    )
    steps = {**timeline(child.events, child.commits), **spark_events(events_dir)}
    zero = steps.pop("session")
    workers = [e for e in child.events if e["event"] in ("mapper", "reducer")]
    result = {
        "launch": child.launch - zero,
        **{k: v - zero for k, v in steps.items()},
        CPU_STEPS[0]: statistics.median(e["parent_cpu"] for e in workers),
        CPU_STEPS[1]: statistics.median(e["cpu"] for e in workers),
        CPU_STEPS[2]: child.report.cpu_seconds,
    }
    (run_dir.parent / f"timeline-{run}.json").write_text(
        json.dumps({"steps": result, "events": child.events, "commits": child.commits})
    )
    return result


def event_log_conf(events_dir: Path) -> dict[str, str]:
    """Settings that make Spark write its event log, uncompressed, into ``events_dir``."""
    if events_dir.exists():
        shutil.rmtree(events_dir)
    events_dir.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{events_dir}",
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def measure_floor(slots: int, run: int, log: Any = print) -> dict[str, float]:
    """One run of the floor (:mod:`bench.spark_floor`), in seconds since the session was up."""
    run_dir = RESULTS / "spark_start" / f"floor-{run}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    events_dir = run_dir / "events"
    settings = {
        "slots": slots,
        "database": str(run_dir / "floor.db"),
        "spark_conf": event_log_conf(events_dir),
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = run_dir / "floor.json"
    subprocess.run(
        [sys.executable, "-m", "bench.spark_floor", str(out), json.dumps(settings)],
        env=env,
        cwd=str(REPO),
        check=True,
    )
    floor = json.loads(out.read_text())
    tasks = floor["tasks"]
    zero = floor["session"]
    steps = {
        **spark_events(events_dir),
        "PySpark daemon started": min(t["parent"] for t in tasks),
        "first Python worker forked": min(t["forked"] for t in tasks),
        "last Python worker forked": max(t["forked"] for t in tasks),
        "first task's function entered": min(t["entered"] for t in tasks),
        "first commit": min(t["committed"] for t in tasks),
    }
    result = {k: v - zero for k, v in steps.items()}
    result[CPU_STEPS[0]] = statistics.median(t["parent_cpu"] for t in tasks)
    result["CPU s of a worker from its fork to its commit (median)"] = statistics.median(
        t["cpu"] for t in tasks
    )
    log(f"  floor run {run}: first commit {result['first commit']:.2f} s after the session")
    return result


def rate_once_running(commits: list[dict[str, Any]], input_rows: int) -> float:
    """Input rows per second after the first commit (a commit's shuffle rows scaled by the
    run's input rows per shuffle row)."""
    if len(commits) < 2:
        raise RuntimeError("fewer than two commits: run more rows")
    scale = input_rows / sum(c["rows"] for c in commits)
    later = sum(c["rows"] for c in commits[1:]) * scale
    return later / (commits[-1]["t"] - commits[0]["t"])


def compare_local(args: argparse.Namespace, log: Any = print) -> None:
    """Rows/s once running, local runner against Spark runner on ``local[2]``, in turns."""
    workload = generate(spec_from_args(args), args.data_root, verbose=False)
    conf = {"spark.python.daemon.module": args.daemon_module} if args.daemon_module else {}
    rates: dict[str, list[tuple[float, float]]] = {"local": [], "spark": []}
    for run in range(args.repeat):
        for runner in rates:
            opts = MillstreamOptions(num_reducers=1, runner=runner, bookkeeping_run=False)
            child = run_child(
                workload,
                "keyed_sum",
                opts,
                RESULTS / "spark_start" / f"{runner}-{run}",
                write_output=True,
                log=log,
                extra={"num_mappers": 1, "spark_conf": conf},
            )
            rate = rate_once_running(child.commits, workload.spec.rows)
            rates[runner].append((rate, child.report.cpu_seconds))
            cpu = child.report.cpu_seconds
            log(f"  {runner}: {rate / 1e6:.2f} M rows/s once running, {cpu:.1f} CPU s")
    print("\n| runner | M rows/s once running (median) | runs | CPU s (median) |")
    print("|---|---|---|---|")
    for runner, values in rates.items():
        cells = ", ".join(f"{r / 1e6:.2f}" for r, _ in values)
        rate = statistics.median(r for r, _ in values) / 1e6
        cpu = statistics.median(c for _, c in values)
        print(f"| {runner} | {rate:.2f} | {cells} | {cpu:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_spec_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--daemon-module", default=None, help="spark.python.daemon.module")
    parser.add_argument(
        "--compare-local", action="store_true", help="rows/s once running against the local runner"
    )
    parser.add_argument(
        "--tuning",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Tuning field of the job, e.g. --tuning gather_seconds=0 (repeatable)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="the simplest Python job's start in turns with ours"
    )
    args = parser.parse_args()
    if args.compare_local:
        compare_local(args)
        return
    runs: list[dict[str, float]] = []
    floors: list[dict[str, float]] = []
    for run in range(args.repeat):
        if args.floor:
            slots = args.partitions + MillstreamOptions().num_reducers
            floors.append(measure_floor(slots, run))
        runs.append(measure_start(args, run))
    print(f"\n| step | seconds after the session was up (median of {len(runs)}) | runs |")
    print("|---|---|---|")
    for step in ("launch", *STEPS, *CPU_STEPS):
        print(f"| {step} | {_median_cells([r[step] for r in runs])} |")
    if floors:
        print_floor(floors, runs)


def _median_cells(values: list[float]) -> str:
    """``median | run, run, ...``: two table cells."""
    cells = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.median(values):.2f} | {cells}"


def _median_of_runs(values: list[float]) -> str:
    """``median (run, run, ...)``: one table cell."""
    cells = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.median(values):.2f} ({cells})"


def print_floor(floors: list[dict[str, float]], runs: list[dict[str, float]]) -> None:
    """The floor's timeline beside millstream's, and each run's first commit over the
    floor's of the same turn."""
    print("\n| step of the floor | floor (median, runs) | millstream's step | millstream |")
    print("|---|---|---|---|")
    for step, ours in FLOOR_STEPS.items():
        floor_cells = _median_of_runs([f[step] for f in floors])
        ours_cells = _median_of_runs([r[ours] for r in runs])
        print(f"| {step} | {floor_cells} | {ours} | {ours_cells} |")
    for step in (CPU_STEPS[0], "CPU s of a worker from its fork to its commit (median)"):
        print(f"| {step} | {_median_of_runs([f[step] for f in floors])} | | |")
    ratios = [
        r["first reducer commit"] / f["first commit"] for f, r in zip(floors, runs, strict=True)
    ]
    print(
        f"\nFirst commit, millstream over the floor, per turn: "
        f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
