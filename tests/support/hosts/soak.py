"""The nemesis soak: every job over many seeds, longer cuts. Run as root from the
repository root (workers import the test jobs by module name):

    PYTHONPATH=python python -m tests.support.hosts.soak --seeds 20

Prints one line per job and seed (the cuts, restarts, drain after the final heal) and
exits non-zero if any seed failed. ``--jobs spark`` runs the keyed sum on a Spark
standalone cluster across hosts instead, one worker host cut from the driver's per seed
(:mod:`tests.support.hosts.spark_cut`; about a minute and a half a seed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import millstream  # noqa: F401  (before grpc: it turns gRPC's fork handlers off)

from tests.support.hosts.scenario import JOBS, SeedResult, run_seed
from tests.support.hosts.spark_cut import SparkCutResult, run_spark_cut


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per job (1..N)")
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--jobs", nargs="+", choices=[*JOBS, "spark"], default=list(JOBS))
    parser.add_argument("--rows", type=int, default=200_000, help="at least (more for long cuts)")
    parser.add_argument("--hold", type=float, nargs=2, default=(2.0, 12.0), metavar=("MIN", "MAX"))
    args = parser.parse_args(argv)
    failed = 0
    for job in args.jobs:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory(prefix=f"millstream-soak-{job}-") as directory:
                try:
                    result: SeedResult | SparkCutResult
                    if job == "spark":
                        result = run_spark_cut(Path(directory), seed, hold=tuple(args.hold))
                    else:
                        result = run_seed(
                            job, seed, Path(directory), rows=args.rows, holds=tuple(args.hold)
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
    sys.exit(main())
