"""Straggler: one reducer down for T seconds under steady load, then back.

The pipeline of :mod:`bench.latency` (a producer appending to a store-backed queue at a
fixed rate, two mappers, two reducers, local runner) runs at ``--rate`` rows/s. After
``--before`` seconds, reducer ``--reducer`` is killed and kept down for ``--stop-seconds``
(:meth:`LocalRunner.hold`), then started again (:meth:`LocalRunner.release`); the run goes
on for ``--after`` seconds, drains, and is checked for exactness as in the latency
benchmark. (Freezing it with ``SIGSTOP`` instead would, on the embedded store, sometimes
freeze it inside a commit holding SQLite's write lock, which stalls every writer: a
property of a single-writer store, not of the shuffle.)

Without straggler spill the mappers' windows fill with the frozen reducer's rows, the
mappers stop reading, and the other reducer starves. With it (``Tuning.spill_after_seconds``)
a mapper whose window stays full writes the rows only the straggler still needs to the
store and reads on. Reported, from samples every ``--sample`` seconds:

* the other reducers' commit rate (input rows committed per second, from the reducers' own
  ``("rows", r)`` counters) over the ``--steady`` seconds before the stop and over the stop;
* every mapper's largest window (bytes, from its status records) against its limit;
* the bytes spilled (the mappers' ``bytes_spilled``), per input byte appended meanwhile,
  and the spilled rows still in the store just before the restart, per reducer;
* how long after the restart the straggler's backlog took to commit.

Run::

    .venv/bin/python -m bench.straggler --rate 62500 --stop-seconds 60 --memory-limit-mb 16

Raw results: ``bench/results/straggler/*.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from millstream.ledger.subspaces import SYSTEM

from bench.pipeline_args import add_pipeline_arguments, make_pipeline, settings
from bench.queue_pipeline import PeriodicSampler, Pipeline, loadavg, log
from bench.queue_producer import ROW_BYTES, ProducerPlan, Step

RESULTS = Path(__file__).resolve().parent / "results" / "straggler"


class Sampler(PeriodicSampler):
    """Reducers' committed rows and mappers' status records, every ``period`` seconds."""

    def sample(self) -> dict[str, Any]:
        _, committed = self.pipeline.read_results()
        statuses = self.pipeline.statuses()
        row: dict[str, Any] = {"t": time.time()}
        for r in range(self.pipeline.num_reducers):
            row[f"r{r}"] = committed.get(r, 0)
        for m in range(self.pipeline.num_mappers):
            s = statuses.get(("mapper", m), {})
            row[f"m{m}"] = {
                "window_bytes": int(s.get("window_bytes", 0)),
                "limit": int(s.get("memory_limit_bytes", 0)),
                "bytes_spilled": int(s.get("bytes_spilled", 0)),
                "rows_spilled": int(s.get("rows_spilled", 0)),
            }
        return row

    def rate(self, reducer: int, begin: float, end: float) -> float:
        """Input rows the reducer committed per second within ``[begin, end]``."""
        inside = [row for row in self.rows if begin <= row["t"] <= end]
        if len(inside) < 2:
            return math.nan
        first, last = inside[0], inside[-1]
        return (last[f"r{reducer}"] - first[f"r{reducer}"]) / (last["t"] - first["t"])


def spilled_in_store(pipeline: Pipeline) -> dict[int, dict[str, int]]:
    """Chunks and bytes of spilled rows in the store now, per reducer."""
    out: dict[int, dict[str, int]] = {}
    store = pipeline.processor.open_store()
    try:
        with store.read() as txn:
            for key, value in txn.get_range_startswith((*SYSTEM, "spill"), snapshot=True):
                entry = out.setdefault(int(key[-3]), {"chunks": 0, "bytes": 0})
                entry["chunks"] += 1
                entry["bytes"] += len(value)
    finally:
        store.close()
    return out


def run_one(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """One run: steady load, freeze a reducer, resume, drain, verify, analyze."""
    r = args.reducer
    total = args.before + args.stop_seconds + args.after
    log(
        f"{label}: {args.rate:,.0f} rows/s; reducer {r} down for {args.stop_seconds:g} s "
        f"after {args.before:g} s; window limit {args.memory_limit_mb:g} MiB, spill after "
        f"{args.spill_after:g} s"
    )
    load_before = loadavg()
    pipeline = make_pipeline(args, label)
    stopped_at = resumed_at = math.nan
    in_store: dict[int, dict[str, int]] = {}
    try:
        pipeline.start(timeout=total + 900)
        producer = pipeline.producer(
            ProducerPlan(steps=(Step(total, args.rate),), tick_seconds=args.tick, keys=args.keys)
        )
        sampler = Sampler(pipeline, args.sample)
        t0 = time.time()
        down = False
        next_line = t0
        assert pipeline.runner is not None
        while producer.poll(0.05) is None:
            if pipeline.failed():
                raise RuntimeError(f"the processor failed: {pipeline.failed()}")
            now = time.time()
            if math.isnan(stopped_at) and now - t0 >= args.before:
                pipeline.runner.hold("reducer", r)
                stopped_at, down = time.time(), True
                log(f"  reducer {r} killed and held down")
            elif down and now - stopped_at >= args.stop_seconds:
                in_store = spilled_in_store(pipeline)
                pipeline.runner.release("reducer", r)
                resumed_at, down = time.time(), False
                waited = resumed_at - stopped_at
                log(f"  reducer {r} released after {waited:.2f} s; spilled in store {in_store}")
            if now >= next_line and sampler.rows:
                next_line += 5.0
                row = sampler.rows[-1]
                log(
                    f"  {row['t'] - t0:6.1f} s  committed "
                    + ", ".join(f"r{i} {row[f'r{i}']:,}" for i in range(pipeline.num_reducers))
                    + "; windows "
                    + ", ".join(
                        f"{row[f'm{m}']['window_bytes'] / 2**20:.1f} MiB"
                        for m in range(pipeline.num_mappers)
                    )
                    + f"; load {loadavg().split()[0]}"
                )
        if down:
            pipeline.runner.release("reducer", r)
        produced = producer.result()
        pipeline.wait(900)
        drained_at = time.time()
        sampler.stop()
        verified = pipeline.verify(produced)
        log(f"  {verified['summary']}")
        result = analyze(args, sampler, stopped_at, resumed_at, drained_at, produced.rows)
        result.update(
            {
                "label": label,
                "verified": verified,
                "spilled_in_store_at_resume": in_store,
                "settings": {**settings(args), "rate": args.rate, "reducer": r},
                "load": [load_before, loadavg()],
                "samples": sampler.rows,
            }
        )
    finally:
        pipeline.close(keep=args.keep)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{label}.json").write_text(json.dumps(result, indent=2, default=float))
    printable = {k: v for k, v in result.items() if k != "samples"}
    log(json.dumps(printable, indent=2, default=float))
    return result


def analyze(
    args: argparse.Namespace,
    sampler: Sampler,
    stopped_at: float,
    resumed_at: float,
    drained_at: float,
    rows_appended: int,
) -> dict[str, Any]:
    """The figures of one run."""
    others = [i for i in range(sampler.pipeline.num_reducers) if i != args.reducer]
    before = {i: sampler.rate(i, stopped_at - args.steady, stopped_at) for i in others}
    # The first seconds of the stop are the window filling and the first spill.
    during = {i: sampler.rate(i, stopped_at, resumed_at) for i in others}
    mappers = range(sampler.pipeline.num_mappers)
    last = sampler.rows[-1] if sampler.rows else {}
    spilled_bytes = sum(last.get(f"m{m}", {}).get("bytes_spilled", 0) for m in mappers)
    appended_during = args.rate * args.stop_seconds * ROW_BYTES
    return {
        "other_reducers_rate_before": before,
        "other_reducers_rate_during": during,
        "other_reducers_rate_ratio": {
            i: during[i] / before[i] if before[i] else math.nan for i in others
        },
        "window_bytes_max": {
            m: max((row[f"m{m}"]["window_bytes"] for row in sampler.rows), default=0)
            for m in mappers
        },
        "window_limit": {m: last.get(f"m{m}", {}).get("limit", 0) for m in mappers},
        "bytes_spilled": spilled_bytes,
        "rows_spilled": sum(last.get(f"m{m}", {}).get("rows_spilled", 0) for m in mappers),
        "bytes_spilled_per_input_byte": spilled_bytes / (rows_appended * ROW_BYTES),
        "bytes_spilled_per_input_byte_during_stop": spilled_bytes / appended_during,
        "resume_to_drained_s": drained_at - resumed_at,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=62_500)
    parser.add_argument("--before", type=float, default=20.0)
    parser.add_argument("--stop-seconds", type=float, default=60.0)
    parser.add_argument("--after", type=float, default=20.0)
    parser.add_argument("--steady", type=float, default=10.0)
    parser.add_argument("--reducer", type=int, default=1)
    parser.add_argument("--sample", type=float, default=0.5)
    parser.add_argument("--tag", default="")
    add_pipeline_arguments(parser)
    args = parser.parse_args()
    tag = f"-{args.tag}" if args.tag else ""
    run_one(args, f"stop-r{args.reducer}-{args.stop_seconds:g}s{tag}")


if __name__ == "__main__":
    main()
