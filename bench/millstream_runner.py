"""Integration point: the millstream side of the end-to-end benchmark (not written yet).

:func:`measure` must do for millstream what
:func:`bench.spark_structured_streaming.measure` does for Spark, and return the same
:class:`~bench.result.RunResult`, so :mod:`bench.e2e` can put both in one table:

1. Build a :class:`millstream.Processor` over ``millstream.inputs.ParquetLog(workload.path)``
   (one mapper per ``partition=<p>`` directory) with the embedded SQLite store in a fresh
   run directory, and

   * ``keyed_sum``: a mapper that pre-aggregates each batch (``group_by("key").sum``) and
     partitions by hash of ``key``; a reducer that folds the sums into the store with the
     transaction's Arrow batch ``add`` (no Python loop per key);
   * ``smallest``: a mapper that only partitions (nothing can be combined before the
     shuffle), a reducer that keeps per key the count and the three smallest payloads.

2. Run it to completion (bounded input drains) in a child process started with
   :func:`bench.io_meter.run_subprocess`, recording the launch time and, for every reducer
   commit, a :class:`~bench.result.BatchRecord` (rows covered, start and end, epoch
   seconds): the first one's end is the time to first commit.
3. Split bytes written: ``output`` = the user's rows in the store, ``state`` = everything
   else (mapper and reducer bookkeeping); report ``total`` and ``net`` from the meter as
   Spark does, and the store file sizes.
4. Read the results back from the store into ``key, total`` (or ``key, count, s0, s1,
   s2``) and check them with :func:`bench.verify.compare` against
   ``workload.expected_sum()`` / ``workload.expected_smallest()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.result import RunResult
from bench.workload import Workload


class MillstreamUnavailable(RuntimeError):
    """The millstream side of the benchmark cannot run (yet)."""


def measure(
    workload: Workload,
    kind: str,
    options: dict[str, Any] | None = None,
    *,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Run ``kind`` (``keyed_sum`` or ``smallest``) through millstream and measure it.

    Raises:
        MillstreamUnavailable: Always, for now: ``millstream.Processor`` cannot be imported
            or this function's body (see the module docstring) is not written yet.
    """
    try:
        from millstream import Processor  # noqa: F401
    except ImportError as exc:
        raise MillstreamUnavailable(
            f"millstream runner not available yet: cannot import millstream.Processor ({exc})"
        ) from exc
    raise MillstreamUnavailable(
        "millstream runner not available yet: millstream.Processor imports, but the benchmark's "
        "millstream side is not written; implement bench/millstream_runner.measure as its "
        "module docstring describes"
    )
