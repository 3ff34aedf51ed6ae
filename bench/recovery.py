"""Recovery: one mapper stopped for T seconds under steady load, then resumed.

The pipeline of :mod:`bench.latency` (a producer appending to a store-backed queue at a
fixed rate, two mappers, two reducers, local runner) runs at ``--rate`` rows/s. After
``--before`` seconds, mapper ``--mapper`` is frozen with ``SIGSTOP`` (its process id from
the local runner) for ``--stop-seconds``, then resumed with ``SIGCONT``; the run goes on
for ``--after`` seconds and then drains, and exactness is checked as in the latency
benchmark (every key's sum and the row count equal the producer's record).

Sampled every ``--sample`` seconds from the benchmark process: the queue's end per
partition and the mappers' status records (published every ``--heartbeat`` seconds, 0.1 s
by default here): rows read (``input_end_row_index``) and window size (``window_rows``,
``window_bytes``). The read lag of a mapper is its partition's end minus the rows it has
read. Reported:

* the lag's steady level (the largest lag in the ``--steady`` seconds before the stop),
  its peak, and the time after ``SIGCONT`` until it is back at or below the steady level
  and stays there for 1 s (status records of a frozen mapper are stale; its lag still
  grows with the queue's end);
* the same for the rows not yet committed end to end (queue end minus the mapper's
  ``input_unread_row_index``, which advances when every reducer has committed): reading
  the backlog is quick, committing it takes longer;
* the stopped mapper's peak window (rows, bytes) after it resumes, against its steady
  level, and the other mapper's peak window;
* what the reducers did meanwhile: each one's longest time without a commit, from the
  commit counts in their status records, and the other mapper's input rows committed
  while the mapper was frozen (a reducer asks every live mapper in each round and waits
  for all answers, so a frozen mapper holds every reducer until the GetRows deadline,
  ``--rpc-timeout``);
* the latency of rows appended before (up to 2 s before the stop), during and after the
  stop, per mapper;
* whether the producer kept its schedule (a process frozen while holding the store's
  write lock would stall every writer).

The status heartbeat is 0.1 s here (``--heartbeat``): 40 more store writes per second
than the default, which adds to latency.

Run::

    .venv/bin/python -m bench.recovery --rate 62500 --stop-seconds 2,10,20
    .venv/bin/python -m bench.recovery --rate 62500 --stop-seconds 10,20 --rpc-timeout 1 \
        --tag rpc1

Raw results: ``bench/results/recovery/*.json``; the table also goes to
``bench/results/recovery/table.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.latency_stats import (
    first_time_at_or_below,
    fmt_ms,
    gaps,
    summarize_latency,
    timeline,
)
from bench.pipeline_args import add_pipeline_arguments, make_pipeline, settings
from bench.queue_pipeline import PeriodicSampler, Pipeline, loadavg, log
from bench.queue_producer import ProducerPlan, Step

RESULTS = Path(__file__).resolve().parent / "results" / "recovery"
HOLD_SECONDS = 1.0


class Sampler(PeriodicSampler):
    """Queue ends and mapper status records, every ``period`` seconds, in a thread."""

    def sample(self) -> dict[str, Any]:
        ends = self.pipeline.queue_ends()
        statuses = self.pipeline.statuses()
        now = time.time()
        row: dict[str, Any] = {"t": now, "ends": ends}
        for m in range(self.pipeline.num_mappers):
            s = statuses.get(("mapper", m), {})
            read = int(s.get("input_end_row_index", 0))
            row[f"m{m}"] = {
                "read": read,
                "lag": ends[m] - read,
                "window_rows": int(s.get("window_rows", 0)),
                "window_bytes": int(s.get("window_bytes", 0)),
                "committed": int(s.get("input_unread_row_index", 0)),
                "status_age": now - float(s.get("time", now)),
            }
        for r in range(self.pipeline.num_reducers):
            s = statuses.get(("reducer", r), {})
            row[f"r{r}"] = {"errors": int(s.get("errors", 0)), "commits": s.get("commits", 0)}
        return row

    def series(self, mapper: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """Times and values of one mapper's sampled figure."""
        t = np.array([row["t"] for row in self.rows])
        v = np.array([row[f"m{mapper}"][what] for row in self.rows], dtype=np.float64)
        return t, v


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {"mean": float(values.mean()), "max": float(values.max())}


def run_one(args: argparse.Namespace, stop_seconds: float, label: str) -> dict[str, Any]:
    """One run: steady load, freeze a mapper, resume, drain, verify, analyze."""
    m = args.mapper
    total = args.before + stop_seconds + args.after
    log(
        f"{label}: {args.rate:,.0f} rows/s; mapper {m} frozen for {stop_seconds:g} s after "
        f"{args.before:g} s; {total:g} s of load; rpc timeout {args.rpc_timeout:g} s, "
        f"heartbeat {args.heartbeat:g} s, commit interval {args.commit_interval:g} s"
    )
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    stopped_at = resumed_at = math.nan
    try:
        pipeline.start(timeout=total + 600)
        producer = pipeline.producer(
            ProducerPlan(steps=(Step(total, args.rate),), tick_seconds=args.tick, keys=args.keys)
        )
        sampler = Sampler(pipeline, args.sample)
        t0 = time.time()
        pid = None
        frozen = False
        next_line = t0
        while producer.poll(0.05) is None:
            if pipeline.failed():
                raise RuntimeError(f"the processor failed: {pipeline.failed()}")
            now = time.time()
            if pid is None and now - t0 >= args.before:
                pid = pipeline.pids()[("mapper", m)]
                os.kill(pid, signal.SIGSTOP)
                stopped_at, frozen = time.time(), True
                log(f"  SIGSTOP mapper {m} (pid {pid})")
            elif frozen and now - stopped_at >= stop_seconds:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)
                resumed_at, frozen = time.time(), False
                log(f"  SIGCONT mapper {m} (pid {pid}) after {resumed_at - stopped_at:.2f} s")
            if now >= next_line:
                next_line += 1.0
                _line(pipeline, sampler, t0)
        if frozen and pid is not None:
            os.kill(pid, signal.SIGCONT)
        produced = producer.result()
        summary = pipeline.wait(600)
        sampler.stop()
        verified = pipeline.verify(produced)
        log(f"  {verified['summary']}")
        statuses = pipeline.statuses()
        result = analyze(
            pipeline, sampler, produced.steps[0], m, stopped_at, resumed_at, args.steady
        )
        result.update(
            {
                "label": label,
                "stop_seconds": stop_seconds,
                "verified": verified,
                "summary": str(summary),
                "reducer_errors": {
                    r: statuses.get(("reducer", r), {}).get("last_error", "")
                    for r in range(pipeline.num_reducers)
                },
                "settings": {
                    **settings(args),
                    "rate": args.rate,
                    "before_s": args.before,
                    "after_s": args.after,
                    "mapper": m,
                    "sample_s": args.sample,
                },
                "samples": sampler.rows,
                "load": [load_before, loadavg()],
            }
        )
    finally:
        pipeline.close(keep=args.keep)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{label}.json").write_text(json.dumps(result, indent=2, default=float))
    _print(result)
    return result


def _line(pipeline: Pipeline, sampler: Sampler, t0: float) -> None:
    if not sampler.rows:
        return
    row = sampler.rows[-1]
    parts = [
        f"m{m} lag {row[f'm{m}']['lag']:,} window {row[f'm{m}']['window_rows']:,}"
        for m in range(pipeline.num_mappers)
    ]
    log(
        f"  {row['t'] - t0:6.1f} s  {'; '.join(parts)}; committed {pipeline.collector.rows:,}  "
        f"load {loadavg().split()[0]}"
    )


def analyze(
    pipeline: Pipeline,
    sampler: Sampler,
    step: dict[str, Any],
    m: int,
    stopped_at: float,
    resumed_at: float,
    steady_seconds: float,
) -> dict[str, Any]:
    """The recovery figures of one run."""
    rate_per_partition = step["rate"] / pipeline.num_mappers
    t, lag = sampler.series(m, "lag")
    _, wrows = sampler.series(m, "window_rows")
    _, wbytes = sampler.series(m, "window_bytes")
    steady = (t >= stopped_at - steady_seconds) & (t < stopped_at)
    level = float(lag[steady].max()) if steady.any() else math.nan
    back = first_time_at_or_below(t, lag, level, after=resumed_at, hold=HOLD_SECONDS)
    after = t >= resumed_at
    # End to end: rows appended but whose effects are not yet committed by every reducer
    # (as far as the mapper knows: its window trims on the reducers' commits).
    _, committed = sampler.series(m, "committed")
    ends = np.array([row["ends"][m] for row in sampler.rows], dtype=np.float64)
    uncommitted = ends - committed
    u_level = float(uncommitted[steady].max()) if steady.any() else math.nan
    u_back = first_time_at_or_below(t, uncommitted, u_level, after=resumed_at, hold=HOLD_SECONDS)
    out: dict[str, Any] = {
        "mapper": m,
        "rate": step["rate"],
        "stopped_at": stopped_at,
        "resumed_at": resumed_at,
        "frozen_s": resumed_at - stopped_at,
        "lag": {
            "steady_rows": _stats(lag[steady]),
            "steady_level_rows": level,
            "peak_rows": float(lag.max()) if lag.size else math.nan,
            "peak_s_of_input": float(lag.max()) / rate_per_partition if lag.size else math.nan,
            "recovered_s_after_resume": (back - resumed_at) if back is not None else None,
        },
        "uncommitted": {
            "steady_rows": _stats(uncommitted[steady]),
            "steady_level_rows": u_level,
            "peak_rows": float(uncommitted.max()) if uncommitted.size else math.nan,
            "recovered_s_after_resume": (u_back - resumed_at) if u_back is not None else None,
        },
        "window": {
            "steady_rows": _stats(wrows[steady]),
            "steady_bytes": _stats(wbytes[steady]),
            "peak_rows_after_resume": float(wrows[after].max()) if after.any() else math.nan,
            "peak_bytes_after_resume": float(wbytes[after].max()) if after.any() else math.nan,
        },
        "other_mappers": {},
    }
    for other in range(pipeline.num_mappers):
        if other == m:
            continue
        _, olag = sampler.series(other, "lag")
        _, orows = sampler.series(other, "window_rows")
        _, obytes = sampler.series(other, "window_bytes")
        during = (t >= stopped_at) & (t <= resumed_at + 5.0)
        _, ocommitted = sampler.series(other, "committed")
        frozen_rows = ocommitted[(t >= stopped_at) & (t <= resumed_at)]
        out["other_mappers"][str(other)] = {
            "lag_steady": _stats(olag[steady]),
            "lag_peak_during": float(olag[during].max()) if during.any() else math.nan,
            "window_rows_steady": _stats(orows[steady]),
            "window_rows_peak_during": float(orows[during].max()) if during.any() else math.nan,
            "window_bytes_peak_during": float(obytes[during].max()) if during.any() else math.nan,
            # Input rows whose effects every reducer committed (and the mapper heard of)
            # between the stop and the resume.
            "input_rows_committed_while_frozen": (
                float(frozen_rows.max() - frozen_rows.min()) if frozen_rows.size else math.nan
            ),
        }
    samples = pipeline.collector.samples()
    reducers: dict[str, Any] = {}
    for r, times in samples.commits().items():
        g = gaps(times)
        mids = times[1:]
        before_mask = mids < stopped_at
        window_mask = (mids >= stopped_at) & (mids <= resumed_at + 15.0)
        frozen_commits = samples.select(
            (samples.reducer == r) & (samples.commit >= stopped_at) & (samples.commit < resumed_at)
        )
        reducers[str(r)] = {
            "commits": len(times),
            "gap_max_before_s": float(g[before_mask].max()) if before_mask.any() else math.nan,
            "gap_max_around_stop_s": float(g[window_mask].max()) if window_mask.any() else math.nan,
            "commits_while_frozen": len(np.unique(frozen_commits.commit)),
            "rows_committed_while_frozen": {
                str(int(x)): int(frozen_commits.rows[frozen_commits.mapper == x].sum())
                for x in range(pipeline.num_mappers)
            },
        }
    # The reducers' status records count commits as they happen (heartbeat thread), which
    # dates them within a sampling period, whatever the reducers report through on_commit.
    times = np.array([row["t"] for row in sampler.rows])
    for r in range(pipeline.num_reducers):
        counts = np.array([float(row[f"r{r}"]["commits"]) for row in sampler.rows])
        changed = times[1:][np.diff(counts) > 0]
        around = changed[(changed >= stopped_at - 5.0) & (changed <= resumed_at + 15.0)]
        steady_changes = changed[(changed >= stopped_at - steady_seconds) & (changed < stopped_at)]
        entry = reducers.setdefault(str(r), {})
        entry["status_gap_max_around_stop_s"] = (
            float(np.diff(around).max()) if around.size > 1 else math.nan
        )
        entry["status_gap_max_before_s"] = (
            float(np.diff(steady_changes).max()) if steady_changes.size > 1 else math.nan
        )
        entry["status_first_commit_after_stop_s"] = next(
            (float(c - stopped_at) for c in changed if c > stopped_at + 2 * sampler.period), None
        )
        entry["status_first_commit_after_resume_s"] = next(
            (float(c - resumed_at) for c in changed if c > resumed_at), None
        )
    out["reducers"] = reducers
    lat: dict[str, Any] = {}
    phases = {
        # Rows appended just before the stop wait through it too: leave 2 s out.
        "before": (step["start"] + 3.0, stopped_at - 2.0),
        "frozen": (stopped_at, resumed_at),
        "after": (resumed_at, step["end"]),
    }
    for phase, (a, b) in phases.items():
        for x in range(pipeline.num_mappers):
            s = samples.select((samples.append >= a) & (samples.append < b) & (samples.mapper == x))
            lat[f"{phase}/mapper{x}"] = summarize_latency(s.latency, s.rows)
    out["latency"] = lat
    out["latency_timeline"] = timeline(
        samples.append, samples.latency, samples.rows, start=step["start"]
    )
    out["producer"] = {
        "achieved_rate": step["achieved_rate"],
        "behind": step["behind"],
        "append": step["append"],
    }
    return out


def _print(r: dict[str, Any]) -> None:
    lag, win = r["lag"], r["window"]
    rec = lag["recovered_s_after_resume"]
    urec = r["uncommitted"]["recovered_s_after_resume"]
    log(
        f"{r['label']}: mapper {r['mapper']} frozen {r['frozen_s']:.2f} s at "
        f"{r['rate']:,.0f} rows/s: lag steady <= {lag['steady_level_rows']:,.0f} rows, peak "
        f"{lag['peak_rows']:,.0f} rows ({lag['peak_s_of_input']:.1f} s of input), back to "
        f"steady {'never' if rec is None else f'{rec:.2f} s'} after resume (uncommitted rows: "
        f"{'never' if urec is None else f'{urec:.2f} s'}); window peak "
        f"{win['peak_rows_after_resume']:,.0f} rows / {win['peak_bytes_after_resume'] / 1e6:.1f}"
        f" MB (steady max {win['steady_rows'].get('max', math.nan):,.0f} rows); reducers' "
        f"longest time without a commit (status records) "
        + ", ".join(
            f"r{k} {v['status_gap_max_around_stop_s']:.2f} s (before "
            f"{v['status_gap_max_before_s']:.2f} s)"
            for k, v in r["reducers"].items()
        )
        + f"; {r['verified']['summary']}"
    )


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table."""
    lines = [
        "| run | rate rows/s | frozen s | rpc timeout s | lag steady ≤ rows | lag peak rows (s of "
        "input) | lag back to steady after resume s | uncommitted rows back to steady after "
        "resume s | window peak after resume rows / MB "
        "| window steady max rows | other mapper window peak rows | each reducer's longest time "
        "without a commit, s (before) | other mapper's input rows committed while frozen "
        "| latency p99 ms before / frozen / after (other mapper) | exact | load before/after |",
        "|" + "---|" * 16,
    ]
    for r in results:
        lag, win = r["lag"], r["window"]
        rec = lag["recovered_s_after_resume"]
        urec = r["uncommitted"]["recovered_s_after_resume"]
        other = next(iter(r["other_mappers"].values()), {})
        o = next(k for k in range(len(r["other_mappers"]) + 1) if k != r["mapper"])
        gaps_text = ", ".join(
            f"{v['status_gap_max_around_stop_s']:.1f} ({v['status_gap_max_before_s']:.1f})"
            for v in r["reducers"].values()
        )
        committed = other.get("input_rows_committed_while_frozen", math.nan)
        lat = [
            r["latency"].get(f"{p}/mapper{o}", {}).get("p99") for p in ("before", "frozen", "after")
        ]
        lines.append(
            f"| {r['label']} | {r['rate']:,.0f} | {r['frozen_s']:.1f} | "
            f"{r['settings']['tuning']['rpc_timeout_seconds']:g} | "
            f"{lag['steady_level_rows']:,.0f} | {lag['peak_rows']:,.0f} "
            f"({lag['peak_s_of_input']:.1f}) | {'never' if rec is None else f'{rec:.2f}'} | "
            f"{'never' if urec is None else f'{urec:.2f}'} | "
            f"{win['peak_rows_after_resume']:,.0f} / {win['peak_bytes_after_resume'] / 1e6:.1f} | "
            f"{win['steady_rows'].get('max', math.nan):,.0f} | "
            f"{other.get('window_rows_peak_during', math.nan):,.0f} | {gaps_text} | "
            f"{committed:,.0f} | {' / '.join(fmt_ms(x) for x in lat)} | "
            f"{'yes' if r['verified']['ok'] else 'NO'} | "
            f"{r['load'][0].split()[0]} / {r['load'][1].split()[0]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100_000, help="offered rows/s")
    parser.add_argument(
        "--stop-seconds", default="10", help="how long the mapper is frozen (comma list)"
    )
    parser.add_argument("--mapper", type=int, default=0, help="which mapper to freeze")
    parser.add_argument("--before", type=float, default=15.0, help="load before the stop, s")
    parser.add_argument("--after", type=float, default=25.0, help="load after the resume, s")
    parser.add_argument(
        "--steady",
        type=float,
        default=8.0,
        help="seconds before the stop that set the steady level",
    )
    parser.add_argument("--sample", type=float, default=0.1, help="sampling period, s")
    parser.add_argument("--tag", default="")
    add_pipeline_arguments(parser)
    parser.set_defaults(heartbeat=0.1)
    args = parser.parse_args()
    tag = f"-{args.tag}" if args.tag else ""
    results = []
    for value in args.stop_seconds.split(","):
        seconds = float(value)
        label = f"stop{seconds:g}s-rate{args.rate:.0f}-rpc{args.rpc_timeout:g}{tag}"
        results.append(run_one(args, seconds, label))
    text = table(results)
    print(text)
    (RESULTS / f"table{tag}.md").write_text(text + "\n")
    if not all(r["verified"]["ok"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
