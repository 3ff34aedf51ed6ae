"""The nemesis soak: every job over many seeds, longer cuts. Run as root from the
repository root (workers import the test jobs by module name):

    PYTHONPATH=python python -m tests.support.hosts.soak --seeds 20

Prints one line per job and seed (the cuts, restarts, drain after the final heal) and
exits non-zero if any seed failed. ``--jobs spark`` runs the keyed sum on a Spark
standalone cluster across hosts instead, one worker host cut from the driver's per seed
(:mod:`tests.support.hosts.spark_cut`; about a minute and a half a seed).

``--store fdb`` puts the store on FoundationDB on a host of its own (the keyed sum and
``spark`` only): the nemesis also cuts a worker host from the store's host, and so does
the Spark run. Each seed then runs in an interpreter of its own
(:mod:`tests.support.hosts.apart`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import millstream  # noqa: F401  (before grpc: it turns gRPC's fork handlers off)

from tests.support.hosts.apart import call_apart
from tests.support.hosts.scenario import JOBS, SeedResult, run_seed
from tests.support.hosts.spark_cut import SparkCutResult, run_spark_cut

SEED_SECONDS = 1_200.0
"""A seed in an interpreter of its own (``--store fdb``) that runs longer has hung."""


def one(
    args: argparse.Namespace, job: str, seed: int, directory: Path
) -> SeedResult | SparkCutResult:
    """One seed of ``job`` as the command line says."""
    if job == "spark":
        return run_spark_cut(directory, seed, store=args.store, hold=tuple(args.hold))
    return run_seed(job, seed, directory, rows=args.rows, holds=tuple(args.hold), store=args.store)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per job (1..N)")
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--jobs", nargs="+", choices=[*JOBS, "spark"], default=list(JOBS))
    parser.add_argument("--rows", type=int, default=200_000, help="at least (more for long cuts)")
    parser.add_argument("--hold", type=float, nargs=2, default=(2.0, 12.0), metavar=("MIN", "MAX"))
    parser.add_argument("--store", choices=["sqlite", "fdb"], default="sqlite")
    args = parser.parse_args(argv)
    if args.store == "fdb" and not set(args.jobs) <= {"keyed_sum", "spark"}:
        parser.error("--store fdb runs the keyed_sum and spark jobs only: pass --jobs with those")
    failed = 0
    for job in args.jobs:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory(prefix=f"millstream-soak-{job}-") as directory:
                try:
                    result = (
                        call_apart(one, args, job, seed, Path(directory), timeout=SEED_SECONDS)
                        if args.store == "fdb"
                        else one(args, job, seed, Path(directory))
                    )
                except Exception:
                    failed += 1
                    print(f"{job} seed {seed}: FAILED", flush=True)
                    traceback.print_exc()
                    continue
            print(result, flush=True)
    total = args.seeds * len(args.jobs)
    print(f"{total - failed} of {total} seeds passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    # From the module by its name, so that ``one`` pickles for call_apart as a name its
    # interpreter can import (not ``__main__.one``).
    from tests.support.hosts import soak

    sys.exit(soak.main())
