"""Bytes written to disk and peak memory of a process tree, sampled from ``/proc``.

Method. A background thread wakes every ``interval`` seconds, lists every process on the
machine (``/proc/<pid>/stat``), and adds to the tracked set any process whose parent is
tracked; the roots are given. For each tracked process it reads ``/proc/<pid>/io`` and
``/proc/<pid>/status`` and keeps the *last* reading, so a process that exits still counts
with what it had written at the last sample. Processes are identified by ``(pid, start
time)``, so a recycled pid is not mistaken for an old process; a process that ``exec``-s
(a launcher script becoming a JVM) keeps its identity and takes its latest name. A process
keeps being tracked after its parent exits (re-parented to init), until it exits itself.

Counters (see ``Documentation/filesystems/proc.rst``, "/proc/<pid>/io"):

* ``write_bytes``: bytes this process caused to be sent to the block layer. Buffered writes
  are charged when a page is dirtied, not when it reaches the disk, so a file written and
  deleted before writeback is charged to the writer and the deleter gets the same amount in
  ``cancelled_write_bytes``. We report ``write_bytes`` (gross) and ``write_bytes -
  cancelled_write_bytes`` (net; what reached or will reach the disk). Rewriting a dirty page
  before writeback is charged once per dirtying, so figures can exceed the device's count.
* ``wchar``: bytes passed to ``write``-family system calls, whether or not they reach a disk
  (pipes and sockets included); kept for reference only.

Reaped children. When a process reaps an exited child, the kernel adds the child's counters
to the parent's ``/proc/<pid>/io`` (``wait_task_zombie``), so a forking server or daemon
would count its workers' writes a second time. A child that was seen to exit while its
parent was tracked is therefore subtracted from the parent (with the child's last reading:
writes of the child after its last sample stay charged to the parent, so they are not
lost), once the parent has been sampled after the child's exit.

Limits. Bytes written by a process between its last sample and its exit are missed unless
a tracked parent reaps it, and so is a process that lives less than one interval; for the
direct child of :func:`run_subprocess` the ``wait4`` resource usage (``ru_oublock``:
``write_bytes`` of the child and every descendant it reaped, in 512-byte blocks) is
returned as a cross-check.
File-system metadata and journal writes (ext4's ``jbd2`` thread) and writeback by the
kernel on behalf of ``mmap``-ed files are not charged to the process. Reading another user's
``/proc/<pid>/io`` needs privileges; unreadable processes are counted as zero.

Memory: the peak over samples of the tree's summed resident set (``VmRSS``; shared pages of
forked workers are counted once per process, so this over-counts) and of the summed
proportional set (``Pss`` from ``smaps_rollup``, which splits shared pages; read every few
samples only), and the largest ``VmHWM`` (a process's own exact peak) seen. Sampling costs
CPU (a ``/proc`` listing per sample), taken from the measured system on a small machine.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessIO:
    """Last reading of one process."""

    pid: int
    start_time: int
    name: str
    cmdline: str
    write_bytes: int = 0
    cancelled_write_bytes: int = 0
    wchar: int = 0
    read_bytes: int = 0
    rss_bytes: int = 0
    pss_bytes: int = 0
    hwm_bytes: int = 0
    baseline: tuple[int, int, int, int] = (0, 0, 0, 0)
    alive: bool = True
    exited: bool = False
    """Exited and not reaped yet (a zombie): it runs and writes nothing more."""
    ppid: int = 0
    last_sample: int = -1
    gone_sample: int = -1
    reaped: tuple[int, int, int, int] = (0, 0, 0, 0)
    cpu_ticks: int = 0
    """``utime + stime`` at the last sample (clock ticks; children not included)."""
    history: list[tuple[int, tuple[int, int, int, int]]] = field(default_factory=list)
    """(sample number, raw counters) at every sample: how much a parent grew, and when."""

    @property
    def counters(self) -> tuple[int, int, int, int]:
        """The raw last reading: write, cancelled write, wchar, read bytes."""
        return (self.write_bytes, self.cancelled_write_bytes, self.wchar, self.read_bytes)

    @property
    def written(self) -> int:
        """``write_bytes`` since tracking began, without reaped children's."""
        return self.write_bytes - self.baseline[0] - self.reaped[0]

    @property
    def cancelled(self) -> int:
        """``cancelled_write_bytes`` since tracking began, without reaped children's."""
        return self.cancelled_write_bytes - self.baseline[1] - self.reaped[1]

    @property
    def wchar_delta(self) -> int:
        """``wchar`` since tracking began, without reaped children's."""
        return self.wchar - self.baseline[2] - self.reaped[2]


def _counters_at(proc: ProcessIO, sample: int) -> tuple[int, int, int, int]:
    """``proc``'s raw counters at its last sample up to ``sample`` (its baseline before)."""
    at = proc.baseline
    for number, counters in proc.history:
        if number > sample:
            break
        at = counters
    return at


def _subtract_reaped(procs: list[ProcessIO]) -> None:
    """Take each exited child's counters off the tracked parent that reaped it.

    Only what the parent's counters grew by since the child was last seen alive can be
    the child's (the kernel adds them at the reap): a parent that exits, or is last
    sampled, before it reaps the child never had them added, so nothing is taken off it.
    """
    by_pid: dict[int, list[ProcessIO]] = {}
    for p in procs:
        by_pid.setdefault(p.pid, []).append(p)
    for child in procs:
        if child.alive:
            continue
        parents = [
            p
            for p in by_pid.get(child.ppid, [])
            if p.start_time <= child.start_time and p.last_sample >= child.gone_sample
        ]
        if not parents:
            continue
        parent = max(parents, key=lambda p: p.start_time)
        before = _counters_at(parent, child.last_sample)
        grown = [now - then for now, then in zip(parent.counters, before, strict=True)]
        parent.reaped = tuple(  # type: ignore[assignment]
            taken + max(0, min(own, growth, now - base - taken))
            for taken, own, growth, now, base in zip(
                parent.reaped, child.counters, grown, parent.counters, parent.baseline, strict=True
            )
        )


@dataclass
class IOReport:
    """What a meter saw: totals over the tree and per process."""

    processes: list[ProcessIO]
    peak_rss_bytes: int
    peak_pss_bytes: int
    peak_hwm_bytes: int
    samples: int
    seconds: float
    wait4_oublock_bytes: int | None = None
    wait4_maxrss_bytes: int | None = None
    wait4_cpu_seconds: float | None = None
    """``ru_utime + ru_stime`` of :func:`run_subprocess`'s command and every descendant
    reaped below it: exact where :attr:`cpu_seconds` misses each process's last interval."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def write_bytes(self) -> int:
        """Gross ``write_bytes`` of the tree."""
        return sum(p.written for p in self.processes)

    @property
    def net_write_bytes(self) -> int:
        """``write_bytes - cancelled_write_bytes`` of the tree."""
        return sum(p.written - p.cancelled for p in self.processes)

    @property
    def wchar(self) -> int:
        """``wchar`` of the tree (reference only)."""
        return sum(p.wchar_delta for p in self.processes)

    @property
    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the tree: each process's last sampled reading, so
        a process's last interval and processes that lived less than one are missed. On a
        shared machine it moves far less than wall time does."""
        return sum(p.cpu_ticks for p in self.processes) / os.sysconf("SC_CLK_TCK")

    def group(self, classify: Callable[[ProcessIO], str]) -> dict[str, dict[str, int]]:
        """Totals per class of process, e.g. ``{"jvm": {"write_bytes": ...}}``."""
        groups: dict[str, dict[str, int]] = {}
        for p in self.processes:
            g = groups.setdefault(
                classify(p), {"processes": 0, "write_bytes": 0, "net_write_bytes": 0, "wchar": 0}
            )
            g["processes"] += 1
            g["write_bytes"] += p.written
            g["net_write_bytes"] += p.written - p.cancelled
            g["wchar"] += p.wchar_delta
        return groups


def _read_stat(pid: int) -> tuple[int, int, str, int, bool] | None:
    """``(ppid, start time, comm, utime + stime, exited)`` of a process (exited: a zombie,
    not reaped yet), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    close = data.rfind(b")")
    comm = data[data.find(b"(") + 1 : close].decode(errors="replace")
    fields = data[close + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])
    return int(fields[1]), int(fields[19]), comm, ticks, fields[0] == b"Z"


def _read_kv(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    value = int(parts[0])
                    out[name] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    except OSError:
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessTreeMeter:
    """Samples ``/proc`` for a set of root processes and all their descendants.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Processes alive when
    tracking starts count from their counters at that moment (their baseline); processes
    born later count from zero.

    Args:
        roots: Pids whose trees are measured (e.g. ``[os.getpid()]`` or a child's pid).
        interval: Seconds between samples.
        pss_every: Read ``smaps_rollup`` (proportional set size) every this many samples;
            0 never. The kernel walks the page tables of every mapping to produce it, which
            costs milliseconds of system time for a JVM with a large heap, so not every time.
    """

    def __init__(self, roots: Iterable[int], interval: float = 0.2, *, pss_every: int = 10) -> None:
        self._roots = set(roots)
        self._interval = interval
        self._pss_every = pss_every
        self._tracked: dict[tuple[int, int], ProcessIO] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._peak_pss = 0
        self._samples = 0
        self._started = 0.0
        self._first = True

    def add_root(self, pid: int) -> None:
        """Track another tree from the next sample on."""
        with self._lock:
            self._roots.add(pid)

    def __enter__(self) -> ProcessTreeMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Take the baseline sample and start the sampling thread."""
        self._started = time.monotonic()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="io-meter", daemon=True)
        self._thread.start()

    def stop(self) -> IOReport:
        """Take a last sample, stop the thread and return the report."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.report()

    def alive(self) -> int:
        """Number of tracked processes still running at the last sample (one that exited
        and waits to be reaped counts as ended: an orphan is reaped by init whenever init
        gets to it, which this machine's init does a second or more later)."""
        with self._lock:
            return sum(1 for p in self._tracked.values() if p.alive and not p.exited)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        """Read every tracked process once (also called by the thread)."""
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> None:
        stats: dict[int, tuple[int, int, str, int, bool]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = _read_stat(int(entry))
                if st is not None:
                    stats[int(entry)] = st
        live_ids = {(pid, st[1]): pid for pid, st in stats.items()}
        tracked_pids = {pid for ident, pid in live_ids.items() if ident in self._tracked}
        tracked_pids |= {pid for pid in self._roots if pid in stats}
        # Descendants: repeat until no new child appears (children listed before parents).
        changed = True
        while changed:
            changed = False
            for pid, (ppid, *_) in stats.items():
                if ppid in tracked_pids and pid not in tracked_pids:
                    tracked_pids.add(pid)
                    changed = True
        for ident, p in self._tracked.items():
            if p.alive and ident not in live_ids:
                p.alive = False
                p.gone_sample = self._samples
        rss = pss = 0
        read_pss = self._pss_every > 0 and self._samples % self._pss_every == 0
        for pid in tracked_pids:
            st = stats.get(pid)
            if st is None:
                continue
            ident = (pid, st[1])
            proc = self._tracked.get(ident)
            io = _read_kv(f"/proc/{pid}/io")
            if not io:
                continue
            status = _read_kv(f"/proc/{pid}/status")
            counters = (
                io.get("write_bytes", 0),
                io.get("cancelled_write_bytes", 0),
                io.get("wchar", 0),
                io.get("read_bytes", 0),
            )
            if proc is None:
                proc = ProcessIO(pid, st[1], st[2], _cmdline(pid))
                if self._first:
                    proc.baseline = counters
                self._tracked[ident] = proc
            (proc.write_bytes, proc.cancelled_write_bytes, proc.wchar, proc.read_bytes) = counters
            proc.ppid, proc.last_sample, proc.cpu_ticks = st[0], self._samples, st[3]
            proc.exited = st[4]
            proc.history.append((self._samples, counters))
            proc.rss_bytes = status.get("VmRSS", 0)
            proc.hwm_bytes = max(proc.hwm_bytes, status.get("VmHWM", 0))
            if read_pss:
                proc.pss_bytes = _read_kv(f"/proc/{pid}/smaps_rollup").get("Pss", 0)
            if proc.name != st[2] or not proc.cmdline:
                # exec keeps the pid: a launcher script that becomes a JVM is named by its end.
                proc.name, proc.cmdline = st[2], _cmdline(pid)
            rss += proc.rss_bytes
            pss += proc.pss_bytes
        self._peak_rss = max(self._peak_rss, rss)
        if read_pss:
            self._peak_pss = max(self._peak_pss, pss)
        self._samples += 1
        self._first = False

    def report(self) -> IOReport:
        """The figures so far."""
        with self._lock:
            procs = [ProcessIO(**vars(p)) for p in self._tracked.values()]
            _subtract_reaped(procs)
            return IOReport(
                processes=procs,
                peak_rss_bytes=self._peak_rss,
                peak_pss_bytes=self._peak_pss,
                peak_hwm_bytes=max((p.hwm_bytes for p in procs), default=0),
                samples=self._samples,
                seconds=time.monotonic() - self._started,
            )


def measure_callable(fn: Callable[[], Any], interval: float = 0.2) -> tuple[Any, IOReport]:
    """Run ``fn`` in this process and measure this process's tree while it runs.

    Returns:
        ``(fn's result, report)``. Includes whatever else this process writes meanwhile.
    """
    with ProcessTreeMeter([os.getpid()], interval) as meter:
        result = fn()
    return result, meter.stop()


def run_subprocess(
    args: Sequence[str],
    *,
    interval: float = 0.2,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    linger: float = 30.0,
    on_sample: Callable[[ProcessTreeMeter], None] | None = None,
) -> tuple[int, IOReport]:
    """Run a command and measure its process tree until the whole tree has exited.

    Args:
        args: The command.
        interval: Seconds between samples.
        env: Environment (default: inherited).
        cwd: Working directory.
        linger: After the command exits, keep sampling its remaining descendants (e.g. a
            JVM that is still shutting down) for at most this many seconds; one that has
            exited and waits for init to reap it (an orphan) is not waited for.
        on_sample: Called about once per second with the meter (progress output).

    Returns:
        ``(exit status, report)``; the report carries ``wait4``'s ``ru_oublock``,
        ``ru_maxrss`` and CPU time of the command as a cross-check.
    """
    proc = subprocess.Popen(list(args), env=dict(env) if env is not None else None, cwd=cwd)
    meter = ProcessTreeMeter([proc.pid], interval)
    meter.start()
    last_tick = time.monotonic()
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            time.sleep(0.05)
            if on_sample is not None and time.monotonic() - last_tick >= 1.0:
                last_tick = time.monotonic()
                on_sample(meter)
    except BaseException:
        proc.kill()
        proc.wait()
        meter.stop()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    meter.sample()
    deadline = time.monotonic() + linger
    while meter.alive() and time.monotonic() < deadline:
        time.sleep(interval)
        meter.sample()
    report = meter.stop()
    report.wait4_oublock_bytes = usage.ru_oublock * 512
    report.wait4_maxrss_bytes = usage.ru_maxrss * 1024
    report.wait4_cpu_seconds = usage.ru_utime + usage.ru_stime
    return proc.returncode, report
