"""The figures of one benchmark run, shared by every system so they share one table."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MB = 1e6


@dataclass
class BatchRecord:
    """One micro-batch (Spark) or one commit (millstream); times are epoch seconds."""

    batch_id: int
    rows: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Duration."""
        return self.end - self.start


@dataclass
class RunResult:
    """What one system did with one workload.

    Attributes:
        system: ``spark`` or ``millstream``.
        workload: ``keyed_sum`` or ``smallest``.
        rows: Input rows.
        input_bytes: Logical input bytes (84 per row).
        parquet_bytes: Bytes of the input files.
        launch: When the process was started (epoch seconds).
        batches: Every batch/commit in order; the first one's end is the first commit.
        written: Bytes written to disk: ``total`` and ``net`` (gross and minus cancelled),
            ``state`` (everything but the sink: checkpoints, state store, shuffle, logs),
            ``output`` (the sink), and finer entries where measured.
        peak_rss_bytes: Peak of the summed resident set of the process tree.
        peak_pss_bytes: Peak of the summed proportional set of the process tree.
        verified: Summary of the key-by-key comparison; ``ok`` says whether it matched.
        settings: The configuration that was measured.
        load: ``/proc/loadavg`` before and after the run (was the machine shared?).
        cpu_seconds: CPU time of the whole process tree (``IOReport.cpu_seconds``); 0 in
            results saved before it was measured.
    """

    system: str
    workload: str
    rows: int
    input_bytes: int
    parquet_bytes: int
    launch: float
    batches: list[BatchRecord]
    written: dict[str, int]
    peak_rss_bytes: int
    peak_pss_bytes: int
    verified: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    load: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0

    @property
    def end(self) -> float:
        """End of the last batch: all input processed and committed."""
        return self.batches[-1].end

    @property
    def wall_seconds(self) -> float:
        """Launch to the last commit."""
        return self.end - self.launch

    @property
    def first_commit_seconds(self) -> float:
        """Launch to the end of the first batch."""
        return self.batches[0].end - self.launch

    @property
    def rows_per_second(self) -> float:
        """Over the whole run, start-up included."""
        return self.rows / self.wall_seconds

    @property
    def running_rows_per_second(self) -> float:
        """Once running: rows after the first batch over the time after the first commit."""
        if len(self.batches) < 2:
            return float("nan")
        rows = self.rows - self.batches[0].rows
        return rows / (self.end - self.batches[0].end)

    @property
    def mb_per_second(self) -> float:
        """Logical input MB/s over the whole run."""
        return self.input_bytes / MB / self.wall_seconds

    @property
    def running_mb_per_second(self) -> float:
        """Logical input MB/s once running."""
        return self.running_rows_per_second * self.input_bytes / self.rows / MB

    def per_input_byte(self, name: str) -> float:
        """``written[name]`` divided by the logical input bytes."""
        return self.written.get(name, 0) / self.input_bytes

    def summary(self) -> dict[str, Any]:
        """Derived figures, for JSON and tables."""
        durations = [b.seconds for b in self.batches]
        return {
            "wall_s": self.wall_seconds,
            "first_commit_s": self.first_commit_seconds,
            "rows_per_s": self.rows_per_second,
            "running_rows_per_s": self.running_rows_per_second,
            "mb_per_s": self.mb_per_second,
            "running_mb_per_s": self.running_mb_per_second,
            "batches": len(self.batches),
            "batch_s_min": min(durations),
            "batch_s_median": statistics.median(durations),
            "batch_s_max": max(durations),
            "written_per_input_byte": {k: self.per_input_byte(k) for k in self.written},
            "peak_rss_mb": self.peak_rss_bytes / MB,
            "peak_pss_mb": self.peak_pss_bytes / MB,
            "cpu_s": self.cpu_seconds,
        }

    def to_json(self) -> dict[str, Any]:
        """Everything, raw and derived."""
        return {**asdict(self), "summary": self.summary()}

    def save(self, path: Path) -> None:
        """Write :meth:`to_json` to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str))

    @classmethod
    def load_json(cls, path: Path) -> RunResult:
        """Read a result written by :meth:`save`."""
        data = json.loads(path.read_text())
        data.pop("summary", None)
        data["batches"] = [BatchRecord(**b) for b in data["batches"]]
        return cls(**data)


def loadavg() -> str:
    """``/proc/loadavg`` (1, 5 and 15 minute load, running/total tasks)."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def cpu_count() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0))


def print_result(result: RunResult, log: Callable[[str], None] = print) -> None:
    """A few lines of figures (the finer written-bytes entries where measured)."""
    s = result.summary()
    w = s["written_per_input_byte"]
    finer = ", ".join(
        f"{name.replace('_', ' ')} {w[name]:.4f}"
        for name in ("checkpoint_files", "shuffle_files", "store_files")
        if name in w
    )
    log(
        f"  {result.system} {result.workload} {result.rows:,} rows: {result.verified['summary']}\n"
        f"    wall {s['wall_s']:.1f} s, first commit {s['first_commit_s']:.2f} s, "
        f"{s['rows_per_s'] / 1e6:.3f} M rows/s whole run, "
        f"{s['running_rows_per_s'] / 1e6:.3f} M rows/s once running, "
        f"{s['mb_per_s']:.1f} MB/s\n"
        f"    {s['batches']} batches of {s['batch_s_min']:.2f}-{s['batch_s_max']:.2f} s "
        f"(median {s['batch_s_median']:.2f}); written per input byte: total "
        f"{w.get('total', 0):.4f} (state {w.get('state', float('nan')):.4f}, output "
        f"{w.get('output', float('nan')):.4f}; {finer}); peak RSS {s['peak_rss_mb']:,.0f} MB "
        f"(PSS {s['peak_pss_mb']:,.0f} MB); load {result.load}"
    )
