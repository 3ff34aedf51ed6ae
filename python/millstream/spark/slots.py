"""How many tasks a Spark application can run at once, checked before a run starts.

Every millstream worker is a task that runs until the processor drains, so a job with
``num_mappers + num_reducers`` tasks needs that many concurrent task slots; with fewer, the
tasks that did not get a slot wait forever for workers that never finish.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from millstream.exceptions import ConfigurationError

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


def slots_of(master: str, conf: Any, default_parallelism: int, executors: int | None) -> Slots:
    """Concurrent task slots from the master URL and configuration (pure, for tests).

    Args:
        master: ``spark.master``, e.g. ``local[4,2]`` or ``yarn``.
        conf: Something with ``get(key, default)`` (a ``SparkConf`` or a dict).
        default_parallelism: ``SparkContext.defaultParallelism``: the total cores of the
            registered executors on a cluster.
        executors: Registered executors (driver excluded), when known.
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
        elif executors and executor_cores:
            cores = executors * executor_cores
            how = f"{executors} executors x {executor_cores} cores"
        else:
            cores = default_parallelism
            how = f"{default_parallelism} cores registered (SparkContext.defaultParallelism)"
    if task_cpus > 1:
        how += f" / spark.task.cpus={task_cpus}"
    return Slots(cores // task_cpus, how)


def available_slots(sc: Any) -> Slots:
    """Concurrent task slots of a live ``SparkContext``."""
    executors: int | None = None
    try:
        # Block managers registered with the driver, the driver's own included.
        executors = max(0, int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)
    except Exception:
        executors = None
    return slots_of(sc.master, sc.getConf(), int(sc.defaultParallelism), executors)


def check_slots(sc: Any, needed: int, what: str = "") -> Slots:
    """Fail at once unless ``needed`` tasks can run concurrently.

    Raises:
        ConfigurationError: Naming how many slots are needed and how many exist.
    """
    slots = available_slots(sc)
    if slots.count < needed:
        raise ConfigurationError(
            f"the millstream Spark job needs {needed} concurrent task slots"
            + (f" ({what})" if what else "")
            + f" but the application has {slots.count}: {slots.how}. Every worker is a task "
            "that runs until the processor drains, so the job would hang. Give the "
            "application more cores (e.g. master local[N] or more executors) or run fewer "
            "mappers and reducers."
        )
    return slots


__all__ = ["Slots", "available_slots", "check_slots", "slots_of"]
