"""Latency from append to commit through the store-backed queue, at a fixed offered rate.

The pipeline (:mod:`bench.queue_pipeline`): a producer process appends rows of the
benchmark shape (int64 key over 100,000 keys, int64 value, 64-byte payload, plus the
append time) to a :class:`millstream.inputs.StoreQueue` in the embedded SQLite store, in
small batches on a fixed schedule; two mappers pre-aggregate each batch, two reducers add
the sums into the store exactly once (local runner, one process per worker). The latency
of a row is the time its reducer transaction committed (taken in ``Reducer.on_commit``)
minus the time it was appended (taken just before the append transaction), for every row.

Three measurements:

1. **Peak** (``--mode ramp``): the producer offers rising rates (``--ramp-start`` rows/s,
   times ``--ramp-factor`` every ``--step-seconds``) until the pipeline falls behind
   (a backlog over 2 s of input) or the producer falls 10 % short of two steps. A
   step is *sustained* when the producer kept its schedule (>= 97 % of the offered rate),
   the latency of the step's rows did not grow (least-squares slope of latency against
   append time <= 0.05 s/s) and their p99 stayed under 1 s. The peak is the highest
   sustained step below the first that is not. ``--mode drain`` measures the consumer
   alone instead: a pre-filled queue drained with no producer running.
2. **Latency at half of peak** (``--mode fixed``, the default after the ramp): one fixed
   rate for ``--seconds``; figures over the rows appended after ``--warmup`` seconds.
   After each fixed run the store's own latency, :mod:`bench.latency_floor` (the same
   producer, rate, length and partitions with no shuffle), is measured too, and the
   latencies are quoted as ratios to it (``--no-floor``: not). ``--runs N`` makes N such
   pairs one after another and prints the median ratios.
   ``--mode idle`` runs the pipeline with nothing appended and reports each worker's CPU
   seconds over ``--seconds``: what waiting for rows costs.
3. **Tuning sweep** (``--sweep name=v1,v2,...``): the fixed-rate run for each value of
   one knob (``commit_interval``, ``idle_seconds``, ``batch_rows``, ``trim_period``,
   ``tick``, ``synchronous``).

Every run checks exactness at the end: the producer seals the queue, the processor drains,
and every key's committed sum and the committed row count must equal what the producer
appended (and ``on_commit`` must have reported every row).

Run (the figures in the report)::

    .venv/bin/python -m bench.latency                       # ramp, then half of its peak
    .venv/bin/python -m bench.latency --mode fixed --rate 200000 --seconds 30
    .venv/bin/python -m bench.latency --mode fixed --rate 200000 \\
        --sweep commit_interval=0.01,0.02,0.05,0.1,0.2
    .venv/bin/python -m bench.latency --mode drain --drain-rows 3000000
    .venv/bin/python -m bench.latency --mode idle --seconds 15 --runs 3

Raw results: ``bench/results/latency/*.json``; the table also goes to
``bench/results/latency/table.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np
from millstream.ledger import REDUCER_ACTIVITIES

from bench import latency_floor, run_queue
from bench.latency_report import RESULTS, print_fixed, ramp_table, save, table
from bench.latency_stats import (
    fmt_ms,
    gap_summary,
    median_ratios,
    summarize_latency,
    timeline,
    weighted_slope,
)
from bench.pipeline_args import add_pipeline_arguments, make_pipeline, settings
from bench.queue_pipeline import Pipeline, Samples, loadavg, log, process_cpu_seconds
from bench.queue_producer import ProducerHandle, ProducerPlan, ProducerResult, Step

SUSTAINED_SLOPE = 0.05
SUSTAINED_P99 = 1.0
SUSTAINED_PRODUCER = 0.97


# --------------------------------------------------------------------------- analysis


def tail_stages(s: Samples) -> dict[str, float]:
    """Where the slowest rows spent their time: over the rows at or above the p99 latency,
    the mean of the latency and of each part (seconds)."""
    p99 = summarize_latency(s.latency, s.rows)["p99"]
    t = s.select(s.latency >= p99)
    return {
        "latency": float(np.average(t.latency, weights=t.rows)),
        "append_to_map": float(np.average(t.mapped - t.append, weights=t.rows)),
        "map_to_fetch": float(np.average(t.fetch - t.mapped, weights=t.rows)),
        "fetch_to_commit": float(np.average(t.commit - t.fetch, weights=t.rows)),
    }


def analyze(samples: Samples, begin: float, end: float) -> dict[str, Any]:
    """Figures over the rows appended in ``[begin, end)``.

    Latency (commit - append) and its parts: append to map (the queue, the mapper's
    polling and its store transactions), map to fetch (waiting in the window for the
    reducer's next round: the commit interval), fetch to commit (reduce, commit, and the
    acknowledgement GetRows that runs before ``on_commit``).
    """
    s = samples.select((samples.append >= begin) & (samples.append < end))
    out: dict[str, Any] = {"window_s": [begin, end], "rows": s.total_rows}
    if not s.total_rows:
        return out
    out["latency"] = summarize_latency(s.latency, s.rows)
    out["append_to_map"] = summarize_latency(s.mapped - s.append, s.rows)
    out["map_to_fetch"] = summarize_latency(s.fetch - s.mapped, s.rows)
    out["fetch_to_commit"] = summarize_latency(s.commit - s.fetch, s.rows)
    out["tail"] = tail_stages(s)
    out["slope"] = weighted_slope(s.append, s.latency, s.rows)
    commits = s.commits()
    out["commit_gaps"] = {str(r): gap_summary(t) for r, t in commits.items()}
    n_commits = sum(len(t) for t in commits.values())
    out["commits"] = n_commits
    out["rows_per_commit"] = s.total_rows / max(1, n_commits)
    span = s.commit.max() - s.commit.min()
    out["committed_rate"] = s.total_rows / span if span > 0 else math.nan
    return out


def step_verdict(step: dict[str, Any], figures: dict[str, Any]) -> tuple[bool, str]:
    """Whether the pipeline sustained a ramp step, and why not."""
    reasons = []
    if step["achieved_rate"] < SUSTAINED_PRODUCER * step["rate"]:
        reasons.append(
            f"producer reached {step['achieved_rate']:,.0f} of {step['rate']:,.0f} rows/s"
        )
    if not figures.get("rows"):
        reasons.append("no rows committed")
    else:
        if figures["slope"] > SUSTAINED_SLOPE:
            reasons.append(f"latency grew {figures['slope']:.3f} s/s")
        if figures["latency"]["p99"] > SUSTAINED_P99:
            reasons.append(f"p99 {figures['latency']['p99']:.2f} s")
    if step.get("stopped_early"):
        reasons.append("stopped early (backlog)")
    return not reasons, "; ".join(reasons)


# --------------------------------------------------------------------------- running


def reducer_time_shares(statuses: dict[tuple[str, int], dict[str, Any]]) -> dict[str, float]:
    """Of the reducers' recent time (mean over reducers), the share in each activity of
    ``REDUCER_ACTIVITIES`` (store transactions, ``reduce``, waiting for mappers)."""
    reducers = [s for (role, _), s in statuses.items() if role == "reducer"]
    return {
        activity: float(
            np.mean([float(s.get(f"seconds_{activity}_per_second", 0)) for s in reducers])
        )
        if reducers
        else 0.0
        for activity in REDUCER_ACTIVITIES
    }


def _progress(
    pipeline: Pipeline,
    t0: float,
    producer: ProducerHandle,
    last: dict[str, float],
    shares: list[tuple[float, dict[str, float]]] | None = None,
) -> tuple[int, int]:
    """One progress line; returns (appended, committed). Appends (time, the reducers'
    time shares) to ``shares``."""
    appended = sum(pipeline.queue_ends())
    committed = pipeline.collector.rows
    now = time.time()
    samples = pipeline.collector.samples()
    recent = samples.select(samples.commit >= now - 2.0)
    lat = summarize_latency(recent.latency, recent.rows) if recent.total_rows else {}
    statuses = pipeline.statuses()
    windows = [
        int(statuses.get(("mapper", m), {}).get("window_rows", 0))
        for m in range(pipeline.num_mappers)
    ]
    rate = (committed - last.get("committed", 0)) / max(1e-9, now - last.get("time", t0))
    last.update(committed=committed, time=now)
    step = producer.steps[-1]["rate"] if producer.steps else float("nan")
    time_shares = reducer_time_shares(statuses)
    if shares is not None:
        shares.append((now, time_shares))
    log(
        f"  {now - t0:6.1f} s  appended {appended:,}  committed {committed:,} "
        f"({rate:,.0f} rows/s)  backlog {appended - committed:,}  last 2 s: p50 "
        f"{fmt_ms(lat.get('p50'))} ms p99 {fmt_ms(lat.get('p99'))} ms  windows {windows}  "
        f"[last step done: {step:,.0f} rows/s]  load {loadavg().split()[0]}  reducers' time: "
        + " ".join(f"{a} {share:.0%}" for a, share in time_shares.items())
    )
    return appended, committed


def _finish(
    pipeline: Pipeline, producer: ProducerHandle, timeout: float = 600
) -> tuple[ProducerResult, Any, dict[str, Any]]:
    produced = producer.result(timeout)
    summary = pipeline.wait(timeout)
    verified = pipeline.verify(produced)
    log(f"  {verified['summary']}")
    return produced, summary, verified


def run_fixed(args: argparse.Namespace, rate: float, label: str) -> dict[str, Any]:
    """One fixed offered rate for ``args.seconds``; figures after ``args.warmup``."""
    log(
        f"{label}: {rate:,.0f} rows/s for {args.seconds:.0f} s, commit interval "
        f"{args.commit_interval} s, idle {args.idle_seconds} s, tick {args.tick} s"
    )
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    try:
        plan = ProducerPlan(
            steps=(Step(args.seconds, rate),),
            tick_seconds=args.tick,
            keys=args.keys,
            spread=args.spread,
        )
        pipeline.start(timeout=args.seconds + 600)
        producer = pipeline.producer(plan)
        t0 = time.time()
        last: dict[str, float] = {}
        shares: list[tuple[float, dict[str, float]]] = []
        # Each process's waits for a core over the steady part (bench.run_queue).
        sched: list[tuple[float, dict[str, run_queue.Schedstat]]] = []
        while producer.poll(2.0) is None:
            if pipeline.failed():
                raise RuntimeError(f"the processor failed: {pipeline.failed()}")
            _progress(pipeline, t0, producer, last, shares)
            if time.time() - t0 >= args.warmup:
                processes = {
                    f"{role} {index}": pid for (role, index), pid in pipeline.pids().items()
                }
                processes["producer"] = producer.process.pid
                sched[1:] = [(time.time(), run_queue.snapshot(processes))]
                if len(sched) == 1:
                    sched.append(sched[0])
        produced, summary, verified = _finish(pipeline, producer)
        samples = pipeline.collector.samples()
        step = produced.steps[0]
        figures = analyze(samples, step["start"] + args.warmup, step["end"])
        whole = analyze(samples, step["start"], step["end"])
        # Rates over the last 10 s: the ones read once that span lies in the steady part.
        steady = [s for at, s in shares if at - 10 >= step["start"] + args.warmup]
        figures["reducer_time_shares"] = {
            activity: float(np.mean([s[activity] for s in steady])) if steady else None
            for activity in REDUCER_ACTIVITIES
        }
        result: dict[str, Any] = {
            "label": label,
            "mode": "fixed",
            "offered_rate": step["rate"],
            "producer": step,
            "steady": figures,
            "whole": {k: whole[k] for k in ("rows", "latency") if k in whole},
            "timeline": timeline(
                samples.append, samples.latency, samples.rows, start=step["start"]
            ),
            "verified": verified,
            "summary": str(summary),
            "settings": {**settings(args), "seconds": args.seconds, "warmup_s": args.warmup},
            "load": [load_before, loadavg()],
        }
        if len(sched) == 2 and sched[1][0] > sched[0][0]:
            (begin, before), (end, after) = sched
            result["run_queue"] = run_queue.waits(before, after, end - begin)
    finally:
        pipeline.close(keep=args.keep)
    if args.floor:
        result["floor"] = _floor(args, rate)
    save(result, label)
    print_fixed(result)
    return result


def _floor(args: argparse.Namespace, rate: float) -> dict[str, Any]:
    """The store's own latency (:mod:`bench.latency_floor`) at the same rate, length,
    partitions, keys and schedule, right after the pipeline's run: the reference its p99
    is quoted against."""
    floor = latency_floor.run(
        rate,
        args.seconds,
        warmup=args.warmup,
        partitions=args.mappers,
        keys=args.keys,
        spread=args.spread,
        trim_period=args.trim_period,
        tick=args.tick,
        store=args.store,
    )
    if not floor["exact"]:
        raise RuntimeError(f"the floor's run was not exact: {floor}")
    return floor


def ramp_steps(args: argparse.Namespace) -> list[Step]:
    """Geometric rates from ``--ramp-start`` up to ``--ramp-max``."""
    steps = []
    rate = args.ramp_start
    while rate <= args.ramp_max:
        steps.append(Step(args.step_seconds, round(rate, -3)))
        rate *= args.ramp_factor
    return steps


def run_ramp(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Rising offered rates until the pipeline falls behind; returns the peak."""
    steps = ramp_steps(args)
    log(
        f"{label}: ramp {steps[0].rate:,.0f} to {steps[-1].rate:,.0f} rows/s, x{args.ramp_factor} "
        f"every {args.step_seconds:.0f} s, commit interval {args.commit_interval} s"
    )
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    try:
        plan = ProducerPlan(steps=tuple(steps), tick_seconds=args.tick, keys=args.keys)
        pipeline.start(timeout=len(steps) * args.step_seconds + 900)
        producer = pipeline.producer(plan)
        t0 = time.time()
        last: dict[str, float] = {}
        behind = 0
        stopped = False
        while producer.poll(2.0) is None:
            if pipeline.failed():
                raise RuntimeError(f"the processor failed: {pipeline.failed()}")
            appended, committed = _progress(pipeline, t0, producer, last)
            done = producer.steps
            achieved = done[-1]["achieved_rate"] if done else steps[0].rate
            short = [s for s in done[-2:] if s["achieved_rate"] < 0.9 * s["rate"]]
            if stopped:
                pass
            elif len(short) == 2:
                log("  the producer fell 10 % short of two steps in a row: stopping the ramp")
                producer.stop()
                stopped = True
            elif appended - committed > max(100_000, 2.0 * achieved):
                behind += 1
                if behind >= 2:
                    log(
                        f"  backlog above 2 s of input at {achieved:,.0f} rows/s: stopping the ramp"
                    )
                    producer.stop()
                    stopped = True
            else:
                behind = 0
        produced, summary, verified = _finish(pipeline, producer, timeout=900)
        samples = pipeline.collector.samples()
        verdicts = []
        peak = 0.0
        failed = False
        for step in produced.steps:
            # The first second of a step still carries the previous rate's queue.
            figures = analyze(samples, step["start"] + min(1.0, step["seconds"] / 4), step["end"])
            ok, why = step_verdict(step, figures)
            if ok and not failed:
                peak = step["rate"]
            failed = failed or not ok
            verdicts.append(
                {
                    "rate": step["rate"],
                    "achieved_rate": step["achieved_rate"],
                    "sustained": ok,
                    "why_not": why,
                    "figures": figures,
                    "producer": step,
                }
            )
            lat = figures.get("latency", {})
            log(
                f"  step {step['rate']:>10,.0f} rows/s: producer {step['achieved_rate']:>10,.0f}, "
                f"p50 {fmt_ms(lat.get('p50'))} ms, p99 {fmt_ms(lat.get('p99'))} ms, slope "
                f"{figures.get('slope', float('nan')):.3f} s/s: "
                f"{'sustained' if ok else 'NOT sustained (' + why + ')'}"
            )
        result = {
            "label": label,
            "mode": "ramp",
            "peak_rate": peak,
            "steps": verdicts,
            "verified": verified,
            "summary": str(summary),
            "settings": {
                **settings(args),
                "ramp_start": args.ramp_start,
                "ramp_factor": args.ramp_factor,
                "step_seconds": args.step_seconds,
            },
            "load": [load_before, loadavg()],
        }
    finally:
        pipeline.close(keep=args.keep)
    save(result, label)
    log(f"{label}: peak sustained rate {peak:,.0f} rows/s ({verified['summary']})")
    return result


def run_drain(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """A pre-filled, sealed queue drained with no producer running: the consumer's peak."""
    log(f"{label}: pre-filling {args.drain_rows:,} rows, then draining")
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    try:
        plan = ProducerPlan(steps=(), prefill_rows=args.drain_rows, keys=args.keys)
        producer = pipeline.producer(plan)
        produced = producer.result()
        log(f"  pre-filled in {produced.prefill['seconds']:.1f} s; starting the processor")
        start = time.time()
        pipeline.start(timeout=900)
        summary = pipeline.wait(900)
        end = time.time()
        verified = pipeline.verify(produced)
        log(f"  {verified['summary']}")
        samples = pipeline.collector.samples()
        first = float(samples.commit.min())
        last = float(samples.commit.max())
        after_first = samples.select(samples.commit > first).total_rows
        result = {
            "label": label,
            "mode": "drain",
            "rows": produced.rows,
            "start_to_last_commit_s": last - start,
            "first_commit_s": first - start,
            "rate_whole": produced.rows / (last - start),
            "rate_once_running": after_first / (last - first) if last > first else math.nan,
            "wall_s": end - start,
            "commits": int(sum(len(t) for t in samples.commits().values())),
            "verified": verified,
            "summary": str(summary),
            "settings": {**settings(args), "drain_rows": args.drain_rows},
            "load": [load_before, loadavg()],
        }
    finally:
        pipeline.close(keep=args.keep)
    save(result, label)
    log(
        f"{label}: {result['rate_whole']:,.0f} rows/s from start to last commit, "
        f"{result['rate_once_running']:,.0f} rows/s after the first commit "
        f"({result['first_commit_s']:.2f} s)"
    )
    return result


def run_idle(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """The pipeline with nothing appended: each worker's CPU over ``args.seconds`` after
    ``args.warmup`` (what waiting for rows costs: wake-ups, not polls, should cost ~0)."""
    log(f"{label}: no rows for {args.warmup:.0f} + {args.seconds:.0f} s; workers' CPU")
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    try:
        pipeline.start(timeout=args.warmup + args.seconds + 600)
        time.sleep(args.warmup)
        pids = pipeline.pids()
        before = {who: process_cpu_seconds(pid) for who, pid in pids.items()}
        time.sleep(args.seconds)
        cpu = {
            f"{role} {index}": process_cpu_seconds(pid) - before[(role, index)]
            for (role, index), pid in pids.items()
        }
        if pipeline.failed() or pipeline.pids() != pids:
            raise RuntimeError(f"a worker failed or restarted: {pipeline.failed()}")
    finally:
        pipeline.close(keep=args.keep)
    result = {
        "label": label,
        "mode": "idle",
        "seconds": args.seconds,
        "cpu_seconds": cpu,
        "cpu_seconds_total": sum(cpu.values()),
        "settings": settings(args),
        "load": [load_before, loadavg()],
    }
    save(result, label)
    log(
        f"{label}: {result['cpu_seconds_total']:.3f} CPU s in {args.seconds:.0f} s idle ("
        + ", ".join(f"{who} {seconds:.3f}" for who, seconds in sorted(cpu.items()))
        + ")"
    )
    return result


# --------------------------------------------------------------------------- main

_SWEEP = {
    "commit_interval": ("commit_interval", float),
    "idle_seconds": ("idle_seconds", float),
    "batch_rows": ("batch_rows", int),
    "trim_period": ("trim_period", float),
    "tick": ("tick", float),
    "synchronous": ("synchronous", str),
    "heartbeat": ("heartbeat", float),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode",
        choices=["auto", "ramp", "fixed", "drain", "idle"],
        default="auto",
        help="auto: ramp, then a fixed run at half of its peak; idle: the workers' CPU with "
        "no rows",
    )
    parser.add_argument("--rate", type=float, default=None, help="fixed offered rate, rows/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="fixed run length")
    parser.add_argument("--warmup", type=float, default=5.0, help="left out of fixed figures")
    parser.add_argument("--ramp-start", type=float, default=100_000)
    parser.add_argument("--ramp-factor", type=float, default=1.25)
    parser.add_argument("--ramp-max", type=float, default=4_000_000)
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument("--drain-rows", type=int, default=3_000_000)
    parser.add_argument("--sweep", default="", help="name=v1,v2,...: one fixed run per value")
    parser.add_argument("--tag", default="", help="suffix of result file names")
    parser.add_argument(
        "--runs", type=int, default=1, help="fixed runs (each with its floor), one after another"
    )
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each fixed run, measure bench.latency_floor at the same rate and length "
        "and report the ratio of the latencies to it",
    )
    add_pipeline_arguments(parser)
    args = parser.parse_args()
    tag = (
        (f"-{args.tag}" if args.tag else "")
        + ("-alo" if args.delivery == "at_least_once" else "")
        + ("-spread" if args.spread else "")
    )
    results: list[dict[str, Any]] = []
    if args.mode == "drain":
        run_drain(args, f"drain-{args.drain_rows}{tag}")
        return
    if args.mode == "idle":
        for run in range(args.runs):
            run_idle(args, f"idle{tag}-run{run + 1}")
        return
    rate = args.rate
    if args.mode in ("auto", "ramp") and rate is None:
        ramp = run_ramp(args, f"ramp-ci{args.commit_interval}{tag}")
        print(ramp_table(ramp))
        if args.mode == "ramp":
            return
        rate = ramp["peak_rate"] / 2
        if rate <= 0:
            sys.exit("no ramp step was sustained")
    if rate is None:
        sys.exit("--mode fixed needs --rate")
    if args.sweep:
        name, _, values = args.sweep.partition("=")
        if name not in _SWEEP:
            sys.exit(f"--sweep: unknown knob {name!r}; choose from {sorted(_SWEEP)}")
        attr, kind = _SWEEP[name]
        for value in values.split(","):
            run_args = argparse.Namespace(**{**vars(args), attr: kind(value)})
            results.append(run_fixed(run_args, rate, f"fixed-{rate:.0f}-{name}={value}{tag}"))
    else:
        for run in range(args.runs):
            suffix = f"-run{run + 1}" if args.runs > 1 else ""
            label = f"fixed-{rate:.0f}-ci{args.commit_interval}{tag}{suffix}"
            results.append(run_fixed(args, rate, label))
    text = table(results)
    pairs = [
        (r["steady"]["latency"], r["floor"]["latency"])
        for r in results
        if "floor" in r and "latency" in r["steady"]
    ]
    if pairs:
        ratios = median_ratios(pairs)
        text += (
            f"\n\nMedian over {len(pairs)} run(s) of the ratio to the floor measured in the same "
            f"invocation: p50 {ratios['p50']:.2f}x, p99 {ratios['p99']:.2f}x."
        )
    print(text)
    (RESULTS / f"table{tag}.md").write_text(text + "\n")
    if not all(r["verified"]["ok"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
