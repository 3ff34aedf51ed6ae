"""The latency benchmark's output (:mod:`bench.latency`): its JSON files, the line that sums
up a fixed run (with its ratio to the store's floor measured beside it), and the markdown
tables of fixed runs and of a ramp."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench import run_queue
from bench.latency_stats import fmt_ms
from bench.queue_pipeline import log
from bench.queue_producer import ROW_BYTES

RESULTS = Path(__file__).resolve().parent / "results" / "latency"
"""Where the JSON of each run and the tables go."""


def save(result: dict[str, Any], label: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{label}.json").write_text(json.dumps(result, indent=2, default=float))


def print_fixed(result: dict[str, Any]) -> None:
    s = result["steady"]
    if "latency" not in s:
        log(f"{result['label']}: no rows in the steady window")
        return
    lat = s["latency"]
    log(
        f"{result['label']}: offered {result['offered_rate']:,.0f} rows/s, committed "
        f"{s['committed_rate']:,.0f} rows/s; latency p50 {fmt_ms(lat['p50'])} ms, p90 "
        f"{fmt_ms(lat['p90'])}, p99 {fmt_ms(lat['p99'])}, p99.9 {fmt_ms(lat['p99.9'])}, max "
        f"{fmt_ms(lat['max'])}; append->map p99 {fmt_ms(s['append_to_map']['p99'])}, "
        f"map->fetch p99 {fmt_ms(s['map_to_fetch']['p99'])}, fetch->commit p99 "
        f"{fmt_ms(s['fetch_to_commit']['p99'])}; {result['verified']['summary']}"
    )
    floor = result.get("floor")
    if floor is not None:
        f = floor["latency"]
        log(
            f"  the store's floor (bench.latency_floor, same invocation): p50 {fmt_ms(f['p50'])} "
            f"ms, p99 {fmt_ms(f['p99'])} ms; ratio to it: p50 {lat['p50'] / f['p50']:.2f}x, "
            f"p99 {lat['p99'] / f['p99']:.2f}x"
        )
    for name, waits in (
        ("", result.get("run_queue")),
        ("the floor's ", (floor or {}).get("run_queue")),
    ):
        if waits:
            log(f"  {name}processes (steady part): {run_queue.describe(waits)}")
    shares = s.get("reducer_time_shares") or {}
    if any(share is not None for share in shares.values()):
        log(
            "  reducers' time (mean over reducers, steady part): "
            + ", ".join(f"{a} {share:.0%}" for a, share in shares.items() if share is not None)
        )


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of fixed-rate runs."""
    lines = [
        "| run | offered rows/s | committed rows/s | MB/s | commit interval (set / median) "
        "| rows/commit | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | append→map p99 "
        "| map→fetch p99 | fetch→commit p99 | producer append p99 ms | exact | load (1-min, "
        "before/after) | floor p99 ms | p99 / floor |",
        "|" + "---|" * 19,
    ]
    for r in results:
        if r.get("mode") != "fixed" or "latency" not in r["steady"]:
            continue
        s = r["steady"]
        lat = s["latency"]
        gaps = [g.get("median", math.nan) for g in s["commit_gaps"].values()]
        lines.append(
            f"| {r['label']} | {r['offered_rate']:,.0f} | {s['committed_rate']:,.0f} | "
            f"{s['committed_rate'] * ROW_BYTES / 1e6:.1f} | "
            f"{r['settings']['tuning']['commit_interval_seconds']} / "
            f"{fmt_ms(float(np.nanmedian(gaps)) if gaps else math.nan)} ms | "
            f"{s['rows_per_commit']:,.0f} | {fmt_ms(lat['p50'])} | {fmt_ms(lat['p90'])} | "
            f"{fmt_ms(lat['p99'])} | {fmt_ms(lat['p99.9'])} | {fmt_ms(lat['max'])} | "
            f"{fmt_ms(s['append_to_map']['p99'])} | {fmt_ms(s['map_to_fetch']['p99'])} | "
            f"{fmt_ms(s['fetch_to_commit']['p99'])} | "
            f"{r['producer']['append'].get('p99_ms', math.nan):.1f} | "
            f"{'yes' if r['verified']['ok'] else 'NO'} | "
            f"{r['load'][0].split()[0]} / {r['load'][1].split()[0]} | "
            + (
                f"{fmt_ms(r['floor']['latency']['p99'])} | "
                f"{lat['p99'] / r['floor']['latency']['p99']:.2f} |"
                if "floor" in r
                else "n/a | n/a |"
            )
        )
    return "\n".join(lines)


def ramp_table(result: dict[str, Any]) -> str:
    """The markdown table of a ramp."""
    lines = [
        "| offered rows/s | producer rows/s | p50 ms | p99 ms | slope s/s | sustained |",
        "|---|---|---|---|---|---|",
    ]
    for v in result["steps"]:
        lat = v["figures"].get("latency", {})
        lines.append(
            f"| {v['rate']:,.0f} | {v['achieved_rate']:,.0f} | {fmt_ms(lat.get('p50'))} | "
            f"{fmt_ms(lat.get('p99'))} | {v['figures'].get('slope', math.nan):.3f} | "
            f"{'yes' if v['sustained'] else 'no: ' + v['why_not']} |"
        )
    return "\n".join(lines)
