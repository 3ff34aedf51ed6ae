"""Process clocks from ``/proc``: when a process started and how much CPU it used.

Standard library only, so that a Spark task can read its own and its parent's clocks
without importing anything the task would not (:mod:`bench.spark_floor`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` from its third (state) on."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_started(pid: int | str = "self") -> float:
    """When process ``pid`` started (wall seconds, to the kernel's clock tick).

    The boot time comes from ``/proc/uptime`` (hundredths of a second), not from
    ``/proc/stat``'s ``btime``, which is whole seconds: a start time built on ``btime`` is
    early by up to a second, the same for every process of one boot."""
    ticks = int(_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")  # starttime, field 22
    return boot_time() + ticks


def boot_time() -> float:
    """When this machine booted (wall seconds, to the hundredth)."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime


def process_cpu(pid: int | str = "self") -> float:
    """CPU seconds process ``pid`` has used (user and system, to the clock tick)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15
