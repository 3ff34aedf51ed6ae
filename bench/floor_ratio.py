"""millstream's marginal rate as a ratio to the single-process floor's, measured in turns.

Issue 47, item 3: on the matrix's natural job (:mod:`bench.counters`, two counters per key,
100,000 keys, one shared keyspace, default :class:`millstream.Tuning`, the default store),
millstream's marginal rate is at least 2/3 of the rate of :mod:`bench.floor` (one process,
pyarrow only, the same Parquet files, the same per-key counters written durably).

A pair is four runs: each system at ``--rows`` and at ``--marginal-rows``, the systems in
turns (the floor first in even pairs, millstream first in odd ones), so a change of the
machine's load reaches both. Each run is timed the same way: from launching its child
process to its last commit (the floor has one); the **marginal rate** of a system is
``(marginal_rows - rows) / (wall at marginal_rows - wall at rows)``, so start-up (the
interpreter, imports, the workers) cancels; a pair's ratio is millstream's marginal rate
over the floor's, and the figure is the median over the pairs. Every run is verified key
by key against the same expected result (:meth:`bench.workload.Workload.expected_counters`),
so the two systems' outputs are equal key by key. Each run's CPU seconds (the sampled
process tree and ``wait4``'s, which are exact for what the child reaped) and the load
average before and after are kept, since wall times on a shared machine move with the load.

Run::

    .venv/bin/python -m bench.floor_ratio --pairs 3

Results: ``bench/results/floor/pair<i>-<system>-<rows>.json`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import floor, millstream_runner
from bench.io_meter import run_subprocess
from bench.result import BatchRecord, RunResult, loadavg
from bench.verify import compare
from bench.workload import Workload, WorkloadSpec, generate

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "floor"
TARGET = 2 / 3
"""millstream's marginal rate over the floor's that issue 47 asks for."""


def log(message: str) -> None:
    """Progress output, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure_floor(
    workload: Workload,
    n: int,
    run_dir: Path,
    *,
    use_threads: bool = True,
    log: Callable[[str], None] = log,
) -> RunResult:
    """One measured run of :mod:`bench.floor` over ``workload``, verified key by key.

    Raises:
        RuntimeError: The floor's process failed.
    """
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "bench.floor", str(workload.path), str(run_dir), str(n)]
    if not use_threads:
        args.append("--single-thread")
    expected = workload.expected_counters(n)
    load_before = loadavg()
    launch = time.time()
    status, report = run_subprocess(args, env=env, cwd=str(REPO))
    load_after = loadavg()
    if status != 0:
        raise RuntimeError(f"the floor's process failed with status {status}; see its output")
    summary = json.loads((run_dir / floor.SUMMARY).read_text())
    verification = compare(expected, floor.read(run_dir / floor.DATABASE, n))
    log(f"  floor {workload.spec.rows:,} rows: {verification.summary()}")
    return RunResult(
        system="floor",
        workload="counters",
        rows=summary["rows"],
        input_bytes=workload.input_bytes,
        parquet_bytes=workload.parquet_bytes,
        launch=launch,
        batches=[BatchRecord(0, summary["rows"], launch, summary["committed"])],
        written={
            "total": report.write_bytes,
            "net": report.net_write_bytes,
            "store_files": sum(f.stat().st_size for f in run_dir.glob(f"{floor.DATABASE}*")),
        },
        peak_rss_bytes=report.peak_rss_bytes,
        peak_pss_bytes=report.peak_pss_bytes,
        verified={"ok": verification.ok, "summary": verification.summary()},
        settings={
            "counters": n,
            "use_threads": use_threads,
            "wait4_cpu_s": report.wait4_cpu_seconds,
        },
        load=[load_before, load_after],
        cpu_seconds=report.cpu_seconds,
    )


def measure_millstream(
    workload: Workload,
    n: int,
    *,
    batch_rows: int | None = None,
    log: Callable[[str], None] = log,
) -> RunResult:
    """One run of the matrix's cell (``n`` counters, shared keys, defaults) over ``workload``
    (``batch_rows``: instead of :class:`millstream.Tuning`'s default, to study the knob)."""
    opts = millstream_runner.MillstreamOptions(
        bookkeeping_run=False, counters=n, layout="shared", batch_rows=batch_rows
    )
    result = millstream_runner.measure(workload, "counters", opts, log=log)
    log(f"  millstream {workload.spec.rows:,} rows: {result.verified['summary']}")
    return result


def _marginal_cpu(small: RunResult, large: RunResult) -> float:
    """CPU seconds per million rows between the two sizes."""
    return (large.cpu_seconds - small.cpu_seconds) / ((large.rows - small.rows) / 1e6)


def _median(values: list[float]) -> tuple[float, int]:
    """The median of the finite values (a pair whose larger run took no longer has no
    marginal rate) and how many there were."""
    finite = [v for v in values if math.isfinite(v)]
    return (statistics.median(finite) if finite else math.nan), len(finite)


@dataclass(frozen=True)
class Pair:
    """Both systems at both sizes, measured in turns."""

    floor_small: RunResult
    floor_large: RunResult
    millstream_small: RunResult
    millstream_large: RunResult

    @staticmethod
    def marginal(small: RunResult, large: RunResult) -> float:
        """Rows between the two sizes over the wall time between them."""
        seconds = large.wall_seconds - small.wall_seconds
        return (large.rows - small.rows) / seconds if seconds > 0 else math.nan

    @property
    def floor_rate(self) -> float:
        """The floor's marginal rate."""
        return self.marginal(self.floor_small, self.floor_large)

    @property
    def millstream_rate(self) -> float:
        """millstream's marginal rate."""
        return self.marginal(self.millstream_small, self.millstream_large)

    @property
    def ratio(self) -> float:
        """millstream's marginal rate over the floor's."""
        return self.millstream_rate / self.floor_rate

    @property
    def cpu_ratio(self) -> float:
        """The floor's marginal CPU seconds per row over millstream's: the rows each does
        per CPU second, as a ratio, which the machine's load moves far less than wall time."""
        return _marginal_cpu(self.floor_small, self.floor_large) / _marginal_cpu(
            self.millstream_small, self.millstream_large
        )

    @property
    def exact(self) -> bool:
        """Every run of the pair matched the expected result key by key."""
        runs = (self.floor_small, self.floor_large, self.millstream_small, self.millstream_large)
        return all(r.verified["ok"] for r in runs)


def measure_pair(
    index: int,
    small: Workload,
    large: Workload,
    n: int,
    *,
    use_threads: bool = True,
    batch_rows: int | None = None,
) -> Pair:
    """Pair ``index``: each system at both sizes, the floor first when ``index`` is even."""
    got: dict[tuple[str, int], RunResult] = {}
    systems = ("floor", "millstream") if index % 2 == 0 else ("millstream", "floor")
    for workload in (small, large):
        for system in systems:
            log(f"pair {index + 1}: {system} at {workload.spec.rows:,} rows")
            if system == "floor":
                run_dir = RESULTS / "runs" / f"floor-{workload.spec.rows}"
                result = measure_floor(workload, n, run_dir, use_threads=use_threads)
            else:
                result = measure_millstream(workload, n, batch_rows=batch_rows)
            result.save(RESULTS / f"pair{index + 1}-{system}-{workload.spec.rows}.json")
            got[(system, workload.spec.rows)] = result
    rows = (small.spec.rows, large.spec.rows)
    return Pair(
        got[("floor", rows[0])], got[("floor", rows[1])], *(got[("millstream", r)] for r in rows)
    )


def table(pairs: list[Pair]) -> str:
    """The pairs as a markdown table, then the median ratio against the target."""
    lines = [
        "| pair | floor wall s (small/large) | floor CPU s | floor marginal M rows/s "
        "| ms wall s | ms CPU s | ms marginal M rows/s | ratio | CPU s per M rows (floor/ms) "
        "| CPU ratio | 1-min load | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(pairs):
        runs = (p.floor_small, p.floor_large, p.millstream_small, p.millstream_large)
        loads = [float(reading.split()[0]) for r in runs for reading in r.load]
        lines.append(
            f"| {i + 1} | {p.floor_small.wall_seconds:.2f} / {p.floor_large.wall_seconds:.2f} "
            f"| {p.floor_small.cpu_seconds:.2f} / {p.floor_large.cpu_seconds:.2f} "
            f"| {p.floor_rate / 1e6:.2f} "
            f"| {p.millstream_small.wall_seconds:.2f} / {p.millstream_large.wall_seconds:.2f} "
            f"| {p.millstream_small.cpu_seconds:.2f} / {p.millstream_large.cpu_seconds:.2f} "
            f"| {p.millstream_rate / 1e6:.2f} | {p.ratio:.2f} "
            f"| {_marginal_cpu(p.floor_small, p.floor_large):.3f} / "
            f"{_marginal_cpu(p.millstream_small, p.millstream_large):.3f} | {p.cpu_ratio:.2f} "
            f"| {min(loads):.1f}-{max(loads):.1f} | {'yes' if p.exact else '**NO**'} |"
        )
    median, counted = _median([p.ratio for p in pairs])
    cpu, _ = _median([p.cpu_ratio for p in pairs])
    verdict = "met" if median >= TARGET else "**not met**"
    lines += [
        "",
        f"Median ratio {median:.2f} over {counted} of {len(pairs)} pairs (target "
        f"{TARGET:.2f}): {verdict}. Median CPU ratio {cpu:.2f}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--marginal-rows", type=int, default=20_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--counters", type=int, default=2, choices=(1, 2, 4))
    parser.add_argument(
        "--single-thread", action="store_true", help="the floor without pyarrow's threads"
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=None,
        help="millstream's Tuning.batch_rows (default: Tuning's default; to study the knob)",
    )
    parser.add_argument("--data-root", type=Path, default=None)
    args = parser.parse_args()
    extra = {} if args.data_root is None else {"root": args.data_root}
    small, large = (
        generate(WorkloadSpec(rows=rows, keys=args.keys), **extra)
        for rows in (args.rows, args.marginal_rows)
    )
    log(f"load before: {loadavg()}")
    pairs = [
        measure_pair(
            i,
            small,
            large,
            args.counters,
            use_threads=not args.single_thread,
            batch_rows=args.batch_rows,
        )
        for i in range(args.pairs)
    ]
    log(f"load after: {loadavg()}")
    text = table(pairs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text)
    print(text)
    if not all(p.exact for p in pairs):
        sys.exit(1)


if __name__ == "__main__":
    main()
