"""The process clocks of the start timelines (:mod:`bench.process_clock`)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.process_clock import boot_time, process_started

TICK = 0.02
"""The kernel's clock tick, and the hundredth of /proc/uptime, with a margin."""


def test_a_child_started_between_the_clock_readings_around_its_spawn() -> None:
    before = time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    after = time.time()
    try:
        started = process_started(child.pid)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert before - TICK <= started <= after + TICK


def test_the_boot_time_is_finer_than_whole_seconds_and_agrees_with_btime() -> None:
    with open("/proc/stat", encoding="ascii") as stat:
        btime = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
    assert btime - TICK <= boot_time() < btime + 1 + TICK
