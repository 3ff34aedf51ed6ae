"""How long each process of a benchmark waited for a core.

Linux keeps, per thread, the nanoseconds it ran, the nanoseconds it spent runnable on a
run queue without a core, and how many times it was given a core
(``/proc/<pid>/task/<tid>/schedstat``). On two cores shared by a producer, mappers,
reducers and the store's writers, every hand-over from one process to the next may wait
there: the mean wait per slice is what each hop of a row's path pays for a core before it
can run, a bound no code in the process can remove.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Schedstat:
    """Sums over a process's threads (threads that ended before the read are left out)."""

    run_ns: int
    wait_ns: int
    slices: int

    def __sub__(self, other: Schedstat) -> Schedstat:
        return Schedstat(
            self.run_ns - other.run_ns, self.wait_ns - other.wait_ns, self.slices - other.slices
        )


def read_schedstat(pid: int) -> Schedstat | None:
    """``pid``'s threads' schedstat sums, or ``None`` when the process is gone."""
    run = wait = slices = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        run += int(fields[0])
        wait += int(fields[1])
        slices += int(fields[2])
    return Schedstat(run, wait, slices)


def snapshot(pids: dict[str, int]) -> dict[str, Schedstat]:
    """Every live process's schedstat, by name."""
    taken = {who: read_schedstat(pid) for who, pid in pids.items()}
    return {who: stat for who, stat in taken.items() if stat is not None}


def waits(
    before: dict[str, Schedstat], after: dict[str, Schedstat], seconds: float
) -> dict[str, dict[str, float]]:
    """Per process between two snapshots: its share of the wall time spent waiting for a
    core, its share running, and the mean wait per slice in milliseconds."""
    figures: dict[str, dict[str, float]] = {}
    for who in before.keys() & after.keys():
        delta = after[who] - before[who]
        figures[who] = {
            "wait_share": delta.wait_ns / 1e9 / seconds,
            "run_share": delta.run_ns / 1e9 / seconds,
            "wait_ms_per_slice": delta.wait_ns / 1e6 / max(delta.slices, 1),
            "slices_per_second": delta.slices / seconds,
        }
    return figures


def describe(figures: dict[str, dict[str, float]]) -> str:
    """One line of :func:`waits`' figures: each process's share of the wall time running
    and waiting for a core, the mean wait per slice, and the cores the processes used."""
    cores = sum(f["run_share"] for f in figures.values())
    return (
        "share of wall time running / waiting for a core, ms per slice: "
        + ", ".join(
            f"{who} {f['run_share']:.0%} / {f['wait_share']:.0%} {f['wait_ms_per_slice']:.2f}"
            for who, f in sorted(figures.items())
        )
        + f"; {cores:.2f} cores running in all"
    )
