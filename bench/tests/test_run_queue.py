"""bench.run_queue reads every thread's schedstat of a live process, and none of a gone one."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import run_queue


def test_a_process_that_ran_shows_its_running_time_and_a_gone_one_shows_nothing() -> None:
    before = run_queue.snapshot({"me": os.getpid()})
    total = 0
    for i in range(2_000_000):
        total += i
    after = run_queue.snapshot({"me": os.getpid()})
    figures = run_queue.waits(before, after, 1.0)
    assert figures["me"]["run_share"] > 0
    assert figures["me"]["wait_share"] >= 0
    assert after["me"].slices >= before["me"].slices

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert run_queue.read_schedstat(child.pid) is None
    assert run_queue.snapshot({"gone": child.pid}) == {}


def test_the_line_names_every_process_with_its_shares_and_sums_the_cores() -> None:
    figures = {
        "reader 0": {"run_share": 0.25, "wait_share": 0.05, "wait_ms_per_slice": 0.04},
        "committer 0": {"run_share": 0.5, "wait_share": 0.2, "wait_ms_per_slice": 0.12},
    }
    line = run_queue.describe(figures)
    assert "committer 0 50% / 20% 0.12, reader 0 25% / 5% 0.04" in line
    assert line.endswith("0.75 cores running in all")
