"""The Spark launcher: every worker is a long-running task of one Spark job.

The job has ``num_mappers + num_reducers`` partitions; partition ``i < num_mappers`` runs
mapper ``i`` and the others run the reducers, each through
:func:`millstream.workers.run_worker` until the processor drains. When a task dies (its
Python worker crashed or was killed, its executor was lost), Spark's task retry
(``spark.task.maxFailures``; ``local[k,F]`` on a local master) starts the worker again with
a new GUID, and the protocol's checks make the new instance and any still-running old one
(a zombie attempt) safe: exactly-once holds.

A stream runs for weeks, and Spark counts a task's failures over the job's whole life
(``spark.task.maxFailures``): four failures a day apart would fail the job. So when the
job fails for a reason a restart can cure (a task failed too often: killed Python workers,
lost executors), the runner submits it again after a backoff, under the same failure-rate
limit as the local runner (``Tuning.restart``: more than ``max_restarts`` failed jobs
within ``interval_seconds`` stop the run with :class:`~millstream.exceptions.CrashLoopError`).
Errors no restart cures (``map``/``reduce`` raising, configuration errors, cancelling,
the timeout) end the run at once.

Cancelling the job (``sc.cancelJobGroup(group)``) ends the workers: Spark kills each task's
Python worker process (SIGKILL from the PySpark daemon after
``spark.python.task.killTimeout``, or SIGTERM without the daemon, which stops the worker
cleanly). Every thread and the gRPC server live in that process, so nothing outlives it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from millstream import exceptions
from millstream.allocator import MALLOC_ENV
from millstream.exceptions import FATAL_ERRORS, ConfigurationError, CrashLoopError, MillstreamError
from millstream.ledger import RunSummary, prepare_store, summarize
from millstream.runner.forkserver import PRELOAD_ENV, user_modules
from millstream.spark.hosts import Deployment, check_deployment, deployment_of
from millstream.spark.slots import SLOT_WAIT_SECONDS, wait_for_slots
from millstream.workers import run_worker

if TYPE_CHECKING:
    from millstream.processor import Processor

log = logging.getLogger("millstream.spark")

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


def _task(
    processor: Processor, deployment: Deployment
) -> Callable[[int, Iterable[Any]], Iterator[TaskResult]]:
    def run_partition(partition: int, _rows: Iterable[Any]) -> Iterator[TaskResult]:
        from pyspark import TaskContext

        role, index = worker_of(processor, partition)
        host = deployment.worker_host(processor)
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
            run_worker(processor, role, index, stop, host=host)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)
        if stop.is_set():
            raise MillstreamError(f"{role} {index} was stopped before it drained")
        yield (role, index, attempt, os.getpid(), time.monotonic() - started)

    return run_partition


_SPARK_ERROR = re.compile(r"(?:SparkException|PythonException|Exception): (.+)")


def _fatal_error(text: str) -> MillstreamError | None:
    """The last error a restart cannot cure (``FATAL_ERRORS``) that a worker raised."""
    latest: tuple[int, MillstreamError] | None = None
    for name in dir(exceptions):
        kind = getattr(exceptions, name)
        if not (isinstance(kind, type) and issubclass(kind, FATAL_ERRORS)):
            continue
        marker = f"millstream.exceptions.{name}: "
        at = text.rfind(marker)
        if at < 0 or (latest is not None and at < latest[0]):
            continue
        message = text[at + len(marker) :].split("\n", 1)[0].strip()
        try:
            error = kind(message)
        except TypeError:  # needs more than a message: its fatal base class
            error = next(base for base in FATAL_ERRORS if issubclass(kind, base))(message)
        latest = (at, error)
    return latest[1] if latest is not None else None


def _translate(exc: BaseException, group: str) -> tuple[MillstreamError, bool]:
    """A millstream error for a failed job, and whether submitting it again may cure it.

    An error a restart cannot cure (``FATAL_ERRORS``: ``map``/``reduce`` raising,
    configuration, corrupt input or store, store limits) that a worker raised comes back
    as itself, and cancelling as a ``MillstreamError`` saying so: neither is curable. Any
    other failure (a task failed ``spark.task.maxFailures`` times: killed workers, lost
    executors, an unreachable store) is.
    """
    text = str(exc)
    fatal = _fatal_error(text)
    if fatal is not None:
        return fatal, False
    if re.search(r"cancelled (?:part of cancelled job group|because SparkContext)", text):
        return MillstreamError(f"the millstream Spark job (group {group!r}) was cancelled"), False
    if "SparkContext was shut down" in text or "SparkContext has been shutdown" in text:
        return MillstreamError(f"the millstream Spark job (group {group!r}): {text}"), False
    cause = _SPARK_ERROR.search(text)
    reason = cause.group(1).strip() if cause else (text.splitlines() or [repr(exc)])[0]
    return MillstreamError(f"the millstream Spark job (group {group!r}) failed: {reason}"), True


def run(
    spark: Any,
    processor: Processor,
    *,
    timeout: float | None = None,
    job_group: str | None = None,
    allow_speculation: bool = False,
    single_host: bool = False,
    slot_wait: float = SLOT_WAIT_SECONDS,
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
        single_host: Every executor runs on this machine (a standalone cluster on one
            host): allows the embedded SQLite store and loopback addresses on a non-local
            master, which are refused otherwise.
        slot_wait: On a cluster, how long to wait for executors to register until there
            is a task slot per worker (a progress line goes to standard error meanwhile).

    Returns:
        The run's summary; ``restarts`` counts task attempts Spark retried and jobs the
        runner submitted again.

    Raises:
        ConfigurationError: Too few task slots, speculation on, an SQLite store or a
            loopback address on a cluster not stated ``single_host``, or a worker found
            the store holding another processor.
        UserCodeError: A worker's ``map`` or ``reduce`` raised (after Spark's retries).
        CrashLoopError: The job failed more often than ``Tuning.restart`` allows.
        TimeoutError: Not drained within ``timeout``.
        MillstreamError: The job failed or was cancelled.
    """
    sc = _spark_context(spark)
    m, r = processor.num_mappers, processor.num_reducers
    n = m + r
    deployment = deployment_of(sc, single_host)
    check_deployment(processor, deployment)
    _check_speculation(sc, allow_speculation)
    wait_for_slots(sc, n, f"{m} mappers + {r} reducers", timeout=slot_wait)
    store = processor.open_store()
    try:
        prepare_store(store, processor.info)
        before = summarize(store, processor.info, 0, 0.0)
    finally:
        store.close()
    # Python workers started for this job get the allocator settings the local runner uses.
    for key, value in MALLOC_ENV.items():
        sc.environment.setdefault(key, value)
    # What the daemon of millstream.spark.daemon imports before it forks them.
    sc.environment[PRELOAD_ENV] = user_modules(processor)
    group = job_group or f"millstream-{processor.name}-{uuid.uuid4().hex[:8]}"
    previous_group = sc.getLocalProperty("spark.jobGroup.id")
    previous_description = sc.getLocalProperty("spark.job.description")
    previous_interrupt = sc.getLocalProperty("spark.job.interruptOnCancel")
    sc.setJobGroup(
        group, f"millstream {processor.name}: {m} mappers + {r} reducers", interruptOnCancel=True
    )
    ended = threading.Event()
    timed_out = threading.Event()

    def cancel() -> None:
        timed_out.set()
        ended.set()
        sc.cancelJobGroup(group)

    timer = threading.Timer(timeout, cancel) if timeout is not None else None
    started = time.monotonic()
    resubmitted = 0
    try:
        if timer is not None:
            timer.daemon = True
            timer.start()
        failures: list[float] = []
        while True:
            if timed_out.is_set():
                raise TimeoutError(f"processor did not drain within {timeout} s")
            rdd = sc.parallelize(range(n), n).mapPartitionsWithIndex(_task(processor, deployment))
            try:
                results: list[TaskResult] = rdd.collect()
                break
            except Exception as exc:
                if timed_out.is_set():
                    raise TimeoutError(f"processor did not drain within {timeout} s") from exc
                error, curable = _translate(exc, group)
                if not curable:
                    raise error from exc
                failures = _failed_again(processor, failures, error)
                pause = processor.tuning.restart.backoff(len(failures))
                log.warning("%s; submitting the job again in %.2f s", error, pause)
                if ended.wait(pause):
                    raise TimeoutError(f"processor did not drain within {timeout} s") from exc
                resubmitted += 1
    finally:
        if timer is not None:
            timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", previous_group)
        sc.setLocalProperty("spark.job.description", previous_description)
        sc.setLocalProperty("spark.job.interruptOnCancel", previous_interrupt)
    seconds = time.monotonic() - started
    restarts = _failed_tasks(sc, group)
    if restarts is None:
        restarts = resubmitted + sum(attempt for _, _, attempt, _, _ in results)
    store = processor.open_store()
    try:
        return summarize(store, processor.info, restarts, seconds, before)
    finally:
        store.close()


def _failed_tasks(sc: Any, group: str) -> int | None:
    """Task attempts that failed in every job of ``group`` (each one a worker restart)."""
    try:
        tracker = sc.statusTracker()
        failed = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                failed += stage.numFailedTasks if stage is not None else 0
        return failed
    except Exception:
        return None


def _failed_again(
    processor: Processor, failures: list[float], error: MillstreamError
) -> list[float]:
    """The failed jobs' times within the restart interval, this one included.

    Raises:
        CrashLoopError: More failed jobs within the interval than ``Tuning.restart`` allows.
    """
    strategy = processor.tuning.restart
    now = time.monotonic()
    recent = [t for t in failures if now - t < strategy.interval_seconds] + [now]
    if len(recent) > strategy.max_restarts:
        raise CrashLoopError(
            f"{error}: the job failed {len(recent)} times within "
            f"{strategy.interval_seconds:g} s, more than the {strategy.max_restarts} "
            "resubmissions the restart strategy allows. Fix the cause and run again (a "
            "restart resumes from the last commit), or allow more with "
            "Tuning(restart=RestartStrategy(max_restarts=..., interval_seconds=...))"
        )
    return recent


__all__ = ["run", "worker_of"]
