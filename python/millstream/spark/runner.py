"""The Spark runner: every worker is a long-running task of one Spark job.

The job has ``num_mappers + num_reducers`` partitions; partition ``i < num_mappers`` runs
mapper ``i`` and the others run the reducers, each through
:func:`millstream.workers.run_worker` until the processor drains. When a task dies (its
Python worker crashed or was killed, its executor was lost), Spark's task retry
(``spark.task.maxFailures``; ``local[k,F]`` on a local master) starts the worker again with
a new GUID, and the protocol's checks make the new instance and any still-running old one
(a zombie attempt) safe: exactly-once holds.

Cancelling the job (``sc.cancelJobGroup(group)``) ends the workers: Spark kills each task's
Python worker process (SIGKILL from the PySpark daemon after
``spark.python.task.killTimeout``, or SIGTERM without the daemon, which stops the worker
cleanly). Every thread and the gRPC server live in that process, so nothing outlives it.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from millstream.exceptions import ConfigurationError, MillstreamError, UserCodeError
from millstream.runner.forkserver import MALLOC_ENV
from millstream.runner.local import RunSummary, prepare_store, summarize
from millstream.spark.slots import check_slots
from millstream.workers import run_worker

if TYPE_CHECKING:
    from millstream.processor import Processor

TaskResult = tuple[str, int, int, int, float]
"""(role, index, attempt number, pid, seconds) of a finished worker task."""


def _spark_context(spark: Any) -> Any:
    return getattr(spark, "sparkContext", spark)


def _check_speculation(sc: Any, allow: bool) -> None:
    on = str(sc.getConf().get("spark.speculation", "false")).strip().lower() == "true"
    if on and not allow:
        raise ConfigurationError(
            "spark.speculation is on: Spark would start speculative copies of the worker "
            "tasks, which run until the processor drains. The copies are safe (a duplicate "
            "worker is fenced like a zombie attempt) but each takes a task slot, and the run "
            "may not have spare ones. Set spark.speculation=false for this application, or "
            "pass allow_speculation=True if the cluster has the slots to spare."
        )


def worker_of(processor: Processor, partition: int) -> tuple[str, int]:
    """The (role, index) a partition of the job runs."""
    m = processor.num_mappers
    return ("mapper", partition) if partition < m else ("reducer", partition - m)


def _task(processor: Processor) -> Callable[[int, Iterable[Any]], Iterator[TaskResult]]:
    def run_partition(partition: int, _rows: Iterable[Any]) -> Iterator[TaskResult]:
        from pyspark import TaskContext

        role, index = worker_of(processor, partition)
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        stop = threading.Event()
        previous: Any = None
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            # Without the PySpark daemon a killed task's worker gets SIGTERM: stop cleanly.
            previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        started = time.monotonic()
        try:
            run_worker(processor, role, index, stop)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)
        if stop.is_set():
            raise MillstreamError(f"{role} {index} was stopped before it drained")
        yield (role, index, attempt, os.getpid(), time.monotonic() - started)

    return run_partition


_SPARK_ERROR = re.compile(r"(?:SparkException|PythonException|Exception): (.+)")


def _translate(exc: BaseException, group: str) -> BaseException:
    """A millstream error for a failed job when a worker raised one, else a summary of it."""
    text = str(exc)
    for kind, error in (("UserCodeError", UserCodeError), ("ConfigurationError", None)):
        marker = f"millstream.exceptions.{kind}: "
        at = text.rfind(marker)
        if at < 0:
            continue
        message = text[at + len(marker) :].split("\n", 1)[0].strip()
        return UserCodeError(message) if error is UserCodeError else ConfigurationError(message)
    if re.search(r"cancelled (?:part of cancelled job group|because SparkContext)", text):
        return MillstreamError(f"the millstream Spark job (group {group!r}) was cancelled")
    found = _SPARK_ERROR.search(text)
    cause = found.group(1).strip() if found else (text.splitlines() or [repr(exc)])[0]
    return MillstreamError(f"the millstream Spark job (group {group!r}) failed: {cause}")


def run(
    spark: Any,
    processor: Processor,
    *,
    timeout: float | None = None,
    job_group: str | None = None,
    allow_speculation: bool = False,
) -> RunSummary:
    """Run every worker of ``processor`` as a task of one Spark job until it drains.

    Args:
        spark: A ``SparkSession`` or ``SparkContext``.
        processor: What to run. It must pickle, and its mapper and reducer classes must be
            importable on the executors (or defined in ``__main__``).
        timeout: Cancel the job and raise ``TimeoutError`` after this many seconds.
        job_group: Spark job group of the run (default ``millstream-<name>-<random>``);
            ``sc.cancelJobGroup(job_group)`` from another thread stops the run.
        allow_speculation: Run even with ``spark.speculation`` on.

    Returns:
        The run's summary; ``restarts`` counts task attempts Spark retried.

    Raises:
        ConfigurationError: Too few task slots, speculation on, or a worker found the store
            holding another processor.
        UserCodeError: A worker's ``map`` or ``reduce`` raised (after Spark's retries).
        TimeoutError: Not drained within ``timeout``.
        MillstreamError: The job failed or was cancelled.
    """
    sc = _spark_context(spark)
    m, r = processor.num_mappers, processor.num_reducers
    n = m + r
    check_slots(sc, n, f"{m} mappers + {r} reducers")
    _check_speculation(sc, allow_speculation)
    store = processor.open_store()
    try:
        prepare_store(processor, store)
        before = summarize(processor, store, 0, 0.0)
    finally:
        store.close()
    # Python workers started for this job get the allocator settings the local runner uses.
    for key, value in MALLOC_ENV.items():
        sc.environment.setdefault(key, value)
    group = job_group or f"millstream-{processor.name}-{uuid.uuid4().hex[:8]}"
    previous_group = sc.getLocalProperty("spark.jobGroup.id")
    previous_description = sc.getLocalProperty("spark.job.description")
    previous_interrupt = sc.getLocalProperty("spark.job.interruptOnCancel")
    sc.setJobGroup(
        group, f"millstream {processor.name}: {m} mappers + {r} reducers", interruptOnCancel=True
    )
    timed_out = threading.Event()

    def cancel() -> None:
        timed_out.set()
        sc.cancelJobGroup(group)

    timer = threading.Timer(timeout, cancel) if timeout is not None else None
    started = time.monotonic()
    try:
        rdd = sc.parallelize(range(n), n).mapPartitionsWithIndex(_task(processor))
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            results: list[TaskResult] = rdd.collect()
        except Exception as exc:
            if timed_out.is_set():
                raise TimeoutError(f"processor did not drain within {timeout} s") from exc
            raise _translate(exc, group) from exc
    finally:
        if timer is not None:
            timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", previous_group)
        sc.setLocalProperty("spark.job.description", previous_description)
        sc.setLocalProperty("spark.job.interruptOnCancel", previous_interrupt)
    seconds = time.monotonic() - started
    restarts = sum(attempt for _, _, attempt, _, _ in results)
    store = processor.open_store()
    try:
        return summarize(processor, store, restarts, seconds, before)
    finally:
        store.close()


__all__ = ["run", "worker_of"]
