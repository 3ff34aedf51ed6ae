"""The I/O meter sees bytes written and fsynced by a toy writer, including by its children."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.io_meter import (
    ProcessIO,
    ProcessTreeMeter,
    _read_stat,
    _subtract_reaped,
    measure_callable,
    run_subprocess,
)

MB = 1 << 20

WRITER = """
import os, sys, time
path, size, children = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def write(p):
    with open(p, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    time.sleep(0.3)  # outlive a few samples so the tree walk sees the bytes
pids = []
for i in range(children):
    pid = os.fork()
    if pid == 0:
        write(f"{path}.{i}")
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
write(path)
"""

LATE_WRITER = """
import os, sys, time
time.sleep(0.2)
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(2 << 20))
    f.flush()
    os.fsync(f.fileno())
"""


def _write_fsync(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())


def test_meter_sees_bytes_written_in_this_process(tmp_path: Path) -> None:
    _, report = measure_callable(lambda: _write_fsync(tmp_path / "a.bin", 8 * MB), interval=0.05)
    assert report.write_bytes >= 8 * MB
    assert report.wchar >= 8 * MB
    assert report.peak_rss_bytes > 0


def test_subprocess_tree_including_children(tmp_path: Path) -> None:
    size, children = 4 * MB, 3
    status, report = run_subprocess(
        [sys.executable, "-c", WRITER, str(tmp_path / "b.bin"), str(size), str(children)],
        interval=0.02,
    )
    assert status == 0
    # The root reaps its children, and the kernel adds their writes to its counters: they
    # are counted once, with the children.
    assert (children + 1) * size <= report.write_bytes < (children + 1.5) * size
    assert len(report.processes) == children + 1
    root = min(report.processes, key=lambda p: p.start_time)
    assert size <= root.written < 1.5 * size
    # wait4 of the root also covers the children it reaped.
    assert report.wait4_oublock_bytes is not None
    assert report.wait4_oublock_bytes >= (children + 1) * size
    assert report.wchar >= size


def test_an_exited_child_not_reaped_yet_has_ended_with_its_bytes(tmp_path: Path) -> None:
    """A process that exited and waits to be reaped (a zombie) no longer counts as running,
    and what it wrote is counted."""
    child = subprocess.Popen([sys.executable, "-c", LATE_WRITER, str(tmp_path / "z.bin")])
    meter = ProcessTreeMeter([child.pid], interval=10.0)
    meter.start()  # its baseline, before it writes
    try:
        assert meter.alive() == 1
        while not _read_stat(child.pid)[4]:  # type: ignore[index]
            time.sleep(0.01)
        meter.sample()  # exited, not reaped: Popen reaps only in wait() or poll()
        assert meter.alive() == 0
        (zombie,) = meter.report().processes
        assert zombie.exited
        assert zombie.written >= 2 * MB
    finally:
        child.wait()
        meter.stop()


def test_process_alive_at_start_counts_from_its_baseline(tmp_path: Path) -> None:
    _write_fsync(tmp_path / "before.bin", 4 * MB)
    with ProcessTreeMeter([os.getpid()], interval=0.05) as meter:
        _write_fsync(tmp_path / "during.bin", 2 * MB)
    report = meter.stop()
    assert 2 * MB <= report.write_bytes < 4 * MB + 2 * MB


def test_deleted_file_is_cancelled(tmp_path: Path) -> None:
    def write_and_delete() -> None:
        path = tmp_path / "gone.bin"
        path.write_bytes(os.urandom(4 * MB))
        path.unlink()

    _, report = measure_callable(write_and_delete, interval=0.05)
    assert report.net_write_bytes <= report.write_bytes


def _proc(pid: int, ppid: int, history: list[int], *, gone: int = -1) -> ProcessIO:
    """A tracked process whose ``write_bytes`` was ``history[i]`` at sample ``i``."""
    proc = ProcessIO(pid, start_time=pid, name="p", cmdline="p", ppid=ppid)
    proc.history = [(i, (w, 0, w, 0)) for i, w in enumerate(history)]
    proc.write_bytes = proc.wchar = history[-1]
    proc.last_sample = len(history) - 1
    proc.alive, proc.gone_sample = gone < 0, gone
    return proc


def test_a_reaped_child_is_taken_off_its_parent() -> None:
    # The child wrote 5 MB; the parent wrote 1 MB itself, then reaped the child (+5 MB).
    child = _proc(2, 1, [0, 5 * MB], gone=2)
    parent = _proc(1, 0, [0, 1 * MB, 1 * MB, 6 * MB])
    _subtract_reaped([parent, child])
    assert (parent.written, child.written) == (1 * MB, 5 * MB)


def test_a_child_its_parent_never_reaped_is_not_taken_off() -> None:
    # The parent was last sampled after the child's exit but before it reaped it (or it
    # exited first): its counters never grew by the child's, so nothing is taken off.
    child = _proc(2, 1, [0, 5 * MB], gone=2)
    parent = _proc(1, 0, [0, 1 * MB, 1 * MB, 1 * MB])
    _subtract_reaped([parent, child])
    assert (parent.written, child.written) == (1 * MB, 5 * MB)


SPINNER = """
import os, sys, time
def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    time.sleep(0.3)  # outlive a few samples so the tree walk sees the last reading
pid = os.fork()
if pid == 0:
    spin(0.5)
    os._exit(0)
spin(0.5)
os.waitpid(pid, 0)
"""


def test_cpu_seconds_count_every_process_of_the_tree() -> None:
    """Two processes each spend 0.5 s of CPU: the tree's CPU time holds both (a sampler
    misses at most one interval of each), not the parent's alone."""
    code, report = run_subprocess([sys.executable, "-c", SPINNER], interval=0.05)
    assert code == 0
    assert 0.9 <= report.cpu_seconds <= 1.5
