"""The queue pipeline's knobs on a benchmark's command line, and the pipeline they make.

Shared by the benchmarks that run :mod:`bench.queue_pipeline` (:mod:`bench.latency`,
:mod:`bench.recovery`, :mod:`bench.straggler`, :mod:`bench.rescale_stream`): one set of
options, one way to turn them into a :class:`~millstream.Tuning` and a pipeline.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import millstream as ms

from bench.queue_pipeline import Pipeline, tuning_dict

RUNS = Path(__file__).resolve().parent / "results" / "latency" / "runs"
"""Where each run's store and files go (one folder per run label)."""


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The pipeline's knobs, as options of a benchmark's command line."""
    d = ms.Tuning()
    parser.add_argument("--mappers", type=int, default=2, help="queue partitions / mappers")
    parser.add_argument("--reducers", type=int, default=2)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--tick", type=float, default=0.01, help="seconds between producer appends")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="every tick appends to every partition (default: one partition per tick, in turn)",
    )
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=0.05,
        help=f"Tuning.commit_interval_seconds (library default {d.commit_interval_seconds})",
    )
    parser.add_argument(
        "--commit-time-share",
        type=float,
        default=d.commit_time_share,
        help="Tuning.commit_time_share (the share of a reducer's time spent in transactions)",
    )
    parser.add_argument("--batch-rows", type=int, default=d.batch_rows)
    parser.add_argument(
        "--memory-limit-mb",
        type=float,
        default=d.memory_limit_bytes / 2**20,
        help="Tuning.memory_limit_bytes, in MiB (per mapper window)",
    )
    parser.add_argument(
        "--spill-after",
        type=float,
        default=d.spill_after_seconds,
        help="Tuning.spill_after_seconds (negative: never spill)",
    )
    parser.add_argument("--idle-seconds", type=float, default=d.idle_seconds)
    parser.add_argument("--trim-period", type=float, default=d.trim_period_seconds)
    parser.add_argument("--heartbeat", type=float, default=d.heartbeat_seconds)
    parser.add_argument("--rpc-timeout", type=float, default=d.rpc_timeout_seconds)
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="the state store (fdb://<cluster file>: emptied before each run); default: "
        "an embedded SQLite file in the run's folder",
    )
    parser.add_argument(
        "--synchronous", choices=["full", "normal"], default="full", help="SQLite synchronous"
    )
    parser.add_argument(
        "--checkpoint-pages",
        type=int,
        default=None,
        help="SQLite write-ahead log pages between checkpoints (store default 16,384)",
    )
    parser.add_argument(
        "--run-min-keys",
        type=int,
        default=None,
        help="SQLite run_min_keys: add_many batches of at least this many keys are stored as "
        "delta runs (store default 256; the reducers here add ~700-1,200 keys per commit)",
    )
    parser.add_argument(
        "--delivery",
        choices=["exactly_once", "at_least_once"],
        default="exactly_once",
        help="Processor.delivery",
    )
    parser.add_argument(
        "--pipeline-fetch",
        action="store_true",
        help="Tuning.pipeline_fetch=True: fetch the next rows while committing",
    )
    parser.add_argument(
        "--tuning",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other Tuning field, e.g. --tuning acknowledge_commits=false (repeatable)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's store")
    parser.add_argument(
        "--what-if-flock",
        action="store_true",
        help="experiment: queue SQLite writers on an flock (bench.queue_pipeline."
        "serialize_sqlite_writers), not millstream's behaviour",
    )


def tuning_value(text: str, default: Any) -> Any:
    """A ``--tuning`` value, of the type of the field's default."""
    if text.lower() == "none":
        return None
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise SystemExit(f"--tuning: expected true or false, got {text!r}")
        return text.lower() == "true"
    if isinstance(default, int):
        return int(text)
    return float(text) if isinstance(default, float) or default is None else text


def tuning_overrides(items: list[str]) -> dict[str, Any]:
    """``--tuning NAME=VALUE`` items as :class:`millstream.Tuning` fields and values."""
    defaults = ms.Tuning()
    extra: dict[str, Any] = {}
    for item in items:
        name, _, text = item.partition("=")
        if not hasattr(defaults, name):
            raise SystemExit(f"--tuning: Tuning has no field {name!r}")
        extra[name] = tuning_value(text, getattr(defaults, name))
    return extra


def tuning_from_args(args: argparse.Namespace) -> ms.Tuning:
    """The worker knobs of a run."""
    return ms.Tuning(
        **tuning_overrides(args.tuning),
        commit_interval_seconds=args.commit_interval,
        commit_time_share=args.commit_time_share,
        batch_rows=args.batch_rows,
        memory_limit_bytes=int(args.memory_limit_mb * 2**20),
        spill_after_seconds=None if args.spill_after < 0 else args.spill_after,
        idle_seconds=args.idle_seconds,
        trim_period_seconds=args.trim_period,
        heartbeat_seconds=args.heartbeat,
        rpc_timeout_seconds=args.rpc_timeout,
        pipeline_fetch=args.pipeline_fetch,
    )


def make_pipeline(args: argparse.Namespace, label: str) -> Pipeline:
    """A fresh pipeline for one run."""
    return Pipeline(
        RUNS / label,
        tuning_from_args(args),
        num_mappers=args.mappers,
        num_reducers=args.reducers,
        keys=args.keys,
        delivery=args.delivery,
        store_options="&".join(
            ([] if args.synchronous == "full" else [f"synchronous={args.synchronous}"])
            + (
                []
                if args.checkpoint_pages is None
                else [f"checkpoint_pages={args.checkpoint_pages}"]
            )
            + ([] if args.run_min_keys is None else [f"run_min_keys={args.run_min_keys}"])
        ),
        store=args.store,
        flock_writers=args.what_if_flock,
    )


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What was measured, for the JSON."""
    return {
        "mappers": args.mappers,
        "reducers": args.reducers,
        "keys": args.keys,
        "tick_s": args.tick,
        "spread": args.spread,
        "store": (args.store or "sqlite").split(":", 1)[0],
        "synchronous": args.synchronous,
        "run_min_keys": args.run_min_keys,
        "what_if_flock": args.what_if_flock,
        "tuning": tuning_dict(tuning_from_args(args)),
    }
