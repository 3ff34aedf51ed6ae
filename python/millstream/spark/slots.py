"""How many tasks a Spark application can run at once, checked before a run starts.

Every millstream worker is a task that runs until the processor drains, so a job with
``num_mappers + num_reducers`` tasks needs that many concurrent task slots; with fewer, the
tasks that did not get a slot wait forever for workers that never finish.

On a cluster, executors register with the driver one by one after the application starts,
so a job submitted right away (a fresh standalone cluster, a notebook's first cell) sees
fewer slots than it will have: :func:`wait_for_slots` waits a bounded time for them,
printing a progress line, before it names what is missing. A local master's slots are
fixed, so a shortfall there fails at once.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from millstream.exceptions import ConfigurationError
from millstream.spark.hosts import is_local_master

SLOT_WAIT_SECONDS = 120.0
"""How long :func:`millstream.spark.run` waits by default for executors to register."""

_LOCAL = re.compile(r"^local\[\s*(\*|\d+)\s*(?:,\s*(\d+)\s*)?\]$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


@dataclass(frozen=True)
class Slots:
    """Concurrent task slots of an application.

    Attributes:
        count: Tasks that can run at once.
        how: Where the figure comes from, for error messages.
    """

    count: int
    how: str


def _conf_int(conf: Any, key: str, default: int) -> int:
    raw = conf.get(key, None)
    try:
        return default if raw is None else int(str(raw).strip())
    except ValueError:
        return default


def slots_of(
    master: str,
    conf: Any,
    default_parallelism: int,
    executors: int | None,
    registered_cores: int | None = None,
) -> Slots:
    """Concurrent task slots from the master URL and configuration (pure, for tests).

    Args:
        master: ``spark.master``, e.g. ``local[4,2]`` or ``yarn``.
        conf: Something with ``get(key, default)`` (a ``SparkConf`` or a dict).
        default_parallelism: ``SparkContext.defaultParallelism``: the total cores of the
            registered executors on a cluster (at least 2, or
            ``spark.default.parallelism``).
        executors: Registered executors (driver excluded), when known.
        registered_cores: Cores of the registered executors (driver excluded), when known.
    """
    task_cpus = max(1, _conf_int(conf, "spark.task.cpus", 1))
    master = master.strip()
    if master == "local":
        cores, how = 1, "master 'local' (1 core)"
    elif m := _LOCAL.match(master):
        cores = (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))
        how = f"master {master!r} ({cores} cores)"
    elif m := _LOCAL_CLUSTER.match(master):
        workers, per_worker = int(m.group(1)), int(m.group(2))
        cores = workers * per_worker
        how = f"master {master!r} ({workers} workers x {per_worker} cores)"
    else:
        executor_cores = _conf_int(conf, "spark.executor.cores", 0)
        dynamic = str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true"
        max_executors = _conf_int(conf, "spark.dynamicAllocation.maxExecutors", 0)
        if dynamic and executor_cores and 0 < max_executors < 1_000_000:
            cores = max_executors * executor_cores
            how = f"dynamic allocation ({max_executors} executors max x {executor_cores} cores)"
        elif registered_cores is not None and executors is not None:
            cores = registered_cores
            plural = "" if executors == 1 else "s"
            how = f"{executors} executor{plural} registered with {registered_cores} cores"
        elif executors and executor_cores:
            cores = executors * executor_cores
            how = f"{executors} executors x {executor_cores} cores"
        else:
            cores = default_parallelism
            how = f"{default_parallelism} cores registered (SparkContext.defaultParallelism)"
    if task_cpus > 1:
        how += f" / spark.task.cpus={task_cpus}"
    return Slots(cores // task_cpus, how)


def _registered_executors(sc: Any) -> tuple[int, int] | None:
    """(executors, their cores) registered with the driver, the driver excluded."""
    try:
        summaries = sc._jsc.sc().statusStore().executorList(True).iterator()
        executors = cores = 0
        while summaries.hasNext():
            summary = summaries.next()
            if str(summary.id()) != "driver":
                executors += 1
                cores += int(summary.totalCores())
        return executors, cores
    except Exception:
        return None


def available_slots(sc: Any) -> Slots:
    """Concurrent task slots of a live ``SparkContext``."""
    registered = _registered_executors(sc)
    executors, cores = registered if registered is not None else (None, None)
    return slots_of(sc.master, sc.getConf(), int(sc.defaultParallelism), executors, cores)


def _too_few(needed: int, what: str, slots: Slots, waited: float | None) -> ConfigurationError:
    after = f" after waiting {waited:.0f} s for executors to register" if waited else ""
    return ConfigurationError(
        f"the millstream Spark job needs {needed} concurrent task slots"
        + (f" ({what})" if what else "")
        + f" but{after} the application has {slots.count}: {slots.how}; "
        f"{needed - slots.count} missing. Every worker is a task that runs until the "
        "processor drains, so the job would hang. Give the application more cores (master "
        "local[N], more executors or workers, spark.cores.max, spark.executor.cores) or run "
        "fewer mappers and reducers"
        + (
            "; if the cluster is still starting, pass a longer slot_wait to millstream.spark.run."
            if waited
            else "."
        )
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_for_slots(
    sc: Any,
    needed: int,
    what: str = "",
    *,
    timeout: float = SLOT_WAIT_SECONDS,
    poll_seconds: float = 1.0,
    progress: Callable[[str], None] = _stderr,
    slots: Callable[[Any], Slots] = available_slots,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Slots:
    """Wait until ``needed`` tasks can run concurrently, at most ``timeout`` seconds.

    A local master fails at once (its slots never change). On a cluster, a progress line
    goes to ``progress`` when the wait starts and whenever the count changes.

    Args:
        sc: The ``SparkContext``.
        needed: Concurrent tasks the job runs.
        what: What the tasks are, for messages (``"2 mappers + 3 reducers"``).
        timeout: Longest wait for executors to register; 0 checks once.
        poll_seconds: How often to count again.
        progress: Receives the progress lines (default: standard error).
        slots: Counts the slots (:func:`available_slots`).
        clock: Monotonic seconds.
        sleep: Waits.

    Raises:
        ConfigurationError: Still too few slots after ``timeout``, naming how many are
            needed, how many exist and where the figure comes from.
    """
    found = slots(sc)
    if found.count >= needed:
        return found
    if is_local_master(str(sc.master)) or timeout <= 0:
        raise _too_few(needed, what, found, None)
    started = clock()
    deadline = started + timeout
    progress(
        f"millstream: waiting up to {timeout:.0f} s for {needed} concurrent task slots"
        + (f" ({what})" if what else "")
        + f": {found.count} so far ({found.how})"
    )
    while clock() < deadline:
        sleep(min(poll_seconds, max(0.0, deadline - clock())))
        now = slots(sc)
        if now.count >= needed:
            progress(f"millstream: {now.count} task slots ready ({now.how})")
            return now
        if now.count != found.count:
            progress(
                f"millstream: {now.count} of {needed} task slots ({now.how}); "
                f"{max(0.0, deadline - clock()):.0f} s left"
            )
        found = now
    raise _too_few(needed, what, found, clock() - started)


def check_slots(sc: Any, needed: int, what: str = "") -> Slots:
    """Fail at once unless ``needed`` tasks can run concurrently.

    Raises:
        ConfigurationError: Naming how many slots are needed and how many exist.
    """
    return wait_for_slots(sc, needed, what, timeout=0)


__all__ = [
    "SLOT_WAIT_SECONDS",
    "Slots",
    "available_slots",
    "check_slots",
    "slots_of",
    "wait_for_slots",
]
