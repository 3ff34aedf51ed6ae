"""The benchmark workloads through millstream's local runner, measured like Spark's.

A child process (:mod:`bench.millstream_child`) builds a :class:`millstream.Processor` over
``millstream.inputs.ParquetLog(workload.path)`` (one mapper per ``partition=<p>``
directory), with the jobs of :mod:`bench.millstream_jobs` and the embedded SQLite store in
a fresh run directory, and runs it until the bounded input drains. The parent measures the
child's whole process tree from outside with :mod:`bench.io_meter` (bytes written from
``/proc/<pid>/io``, peak RSS and PSS) and times every reducer commit through a FIFO (the
reducers' :meth:`~millstream.Reducer.on_commit` writes one line per commit; nothing of it
touches the disk).

Bytes written: ``total`` and ``net`` from the meter, as for Spark. The store is one SQLite
file, so writes cannot be split by key; instead a second run of the same processor whose
reducers do the same work but write no output (``write_output=False``) measures the
bookkeeping alone (mapper and reducer state, counters, worker registration and status,
batch boundaries): ``state`` is that run's total, ``output`` is the difference.

Each commit becomes a :class:`~bench.result.BatchRecord` that starts where the reducer's
previous commit ended (the first at launch). Its ``rows`` are input rows: exact for
``smallest`` (every input row crosses the shuffle); for ``keyed_sum`` and ``counters`` the mappers
pre-aggregate, so a commit's shuffle rows are scaled by input rows / shuffle rows of the
whole run (whole-run figures do not depend on it).

The results are read back from the store and compared key by key with the workload's
expected results (:func:`bench.verify.compare`).

Run: ``.venv/bin/python -m bench.millstream_runner --rows 5000000 --workload keyed_sum``
(``--help`` for the knobs). Results go to ``bench/results/millstream/``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from bench.counters import CHOICES as COUNTER_CHOICES
from bench.counters import names as counter_names
from bench.fresh_store import empty_store
from bench.io_meter import IOReport, run_subprocess
from bench.millstream_jobs import FIFO_ENV, JOBS, LAYOUTS, NAME, SEPARATOR, SMALLEST
from bench.result import BatchRecord, RunResult, loadavg, print_result
from bench.verify import compare
from bench.workload import SCHEMA, Workload, add_spec_arguments, generate, spec_from_args

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WORKLOADS = tuple(JOBS)


class MillstreamUnavailable(RuntimeError):
    """The millstream side of the benchmark cannot run."""


@dataclass(frozen=True)
class MillstreamOptions:
    """The millstream knobs measured.

    Args:
        num_reducers: Reducer processes (mappers: one per input partition).
        batch_rows: Rows a mapper reads per batch; None: ``Tuning``'s default (figures
            count for jobs with default settings; set it only to study the knob).
        commit_interval_seconds: Minimum time between a reducer's commits; None: the
            default.
        bookkeeping_run: Also run without output writes to measure bookkeeping alone.
        runner: ``local`` (one process per worker, :class:`millstream.runner.LocalRunner`)
            or ``spark`` (every worker a task of one Spark job, :func:`millstream.spark.run`,
            on a ``local[mappers + reducers]`` session in the measured child).
        counters: Counters per key of the ``counters`` workload (1, 2 or 4).
        layout: Where the ``counters`` reducers keep their keys: ``shared`` (one keyspace)
            or ``grouped`` (each reducer's keys under its index).
        store: The state store's URL (``fdb://<cluster file>``: emptied before each run);
            None: SQLite in the run directory.
        store_pids: Processes outside the measured tree that serve the store (the
            ``fdbserver`` processes): their ``/proc/<pid>/io`` ``write_bytes`` over the run
            count in the bytes written.
    """

    num_reducers: int = 2
    batch_rows: int | None = None
    commit_interval_seconds: float | None = None
    bookkeeping_run: bool = True
    runner: str = "local"
    counters: int = 1
    layout: str = "shared"
    store: str | None = None
    store_pids: tuple[int, ...] = ()

    @property
    def system(self) -> str:
        """The name of the system measured: ``millstream`` or ``millstream-spark``."""
        return "millstream" if self.runner == "local" else f"millstream-{self.runner}"


class CommitListener:
    """Collects the reducers' commit lines and the run's events (a worker's start, its
    first rows; :mod:`bench.millstream_jobs`) from a FIFO while a run goes on."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        # Read-write, so the FIFO never reports end-of-file between writers (a restarted
        # reducer reopens it) and opening does not wait for a writer.
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self.commits: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if ready:
                try:
                    pending += os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    continue
                *lines, pending = pending.split(b"\n")
                for record in (json.loads(line) for line in lines if line):
                    if "event" in record:
                        self.events.append(record)
                    else:
                        self.commits.append(record)
            elif self._stop.is_set():
                return

    def stop(self) -> list[dict[str, Any]]:
        """Stop after the FIFO is empty; the commits in order of their time."""
        self._stop.set()
        self._thread.join()
        os.close(self._fd)
        return sorted(self.commits, key=lambda c: c["t"])


class ChildRun(NamedTuple):
    """One measured child run."""

    launch: float
    """Wall time the child was started."""
    commits: list[dict[str, Any]]
    """The reducers' commits in order of their time."""
    report: IOReport
    events: list[dict[str, Any]]
    """The run's events (:class:`CommitListener`), in order of arrival."""
    summary: dict[str, Any]
    """The run's :class:`millstream.RunSummary` as a dict."""


def run_child(
    workload: Workload,
    kind: str,
    opts: MillstreamOptions,
    run_dir: Path,
    *,
    write_output: bool,
    log: Callable[[str], None],
    extra: dict[str, Any] | None = None,
) -> ChildRun:
    """One measured child run (``extra``: more settings for :mod:`bench.millstream_child`)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    listener = CommitListener(run_dir / "commits.fifo")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env[FIFO_ENV] = str(run_dir / "commits.fifo")
    settings = {
        "num_reducers": opts.num_reducers,
        "batch_rows": opts.batch_rows,
        "commit_interval_seconds": opts.commit_interval_seconds,
        "runner": opts.runner,
        "counters": opts.counters,
        "layout": opts.layout,
        "store": opts.store,
        **(extra or {}),
    }
    if opts.store:
        empty_store(opts.store)
    args = [
        sys.executable,
        "-m",
        "bench.millstream_child",
        kind,
        str(workload.path),
        str(run_dir),
        json.dumps(settings),
    ]
    if not write_output:
        args.append("--no-output")
    launch = time.time()

    def progress(meter: Any) -> None:
        if int(time.time() - launch) % 5 == 0:
            log(
                f"    [{time.time() - launch:4.0f} s] {len(listener.commits)} commits, "
                f"{meter.report().write_bytes / 1e6:,.1f} MB written so far"
            )

    served = _write_bytes(opts.store_pids)
    try:
        status, report = run_subprocess(args, env=env, cwd=str(REPO), on_sample=progress)
    finally:
        commits = listener.stop()
    report.extra["store_server_bytes"] = _write_bytes(opts.store_pids) - served
    starts = [e["t"] for e in listener.events if e["event"] == "reducer"]
    if starts:
        log(
            f"    reducers started {min(starts) - launch:.2f}-"
            f"{max(starts) - launch:.2f} s after launch, first commit "
            f"{commits[0]['t'] - launch if commits else float('nan'):.2f} s"
        )
    if status != 0:
        raise RuntimeError(f"millstream child failed with status {status}; see its output above")
    summary = json.loads((run_dir / "child.json").read_text())
    return ChildRun(launch, commits, report, listener.events, summary)


def _write_bytes(pids: tuple[int, ...]) -> int:
    """``write_bytes`` of ``pids`` (the store's servers) from ``/proc/<pid>/io``."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                total += int(line.split()[1])
    return total


def _batches(commits: list[dict[str, Any]], launch: float, input_rows: int) -> list[BatchRecord]:
    """Commits as batch records in input rows (see the module docstring)."""
    shuffled = sum(c["rows"] for c in commits)
    if not commits or shuffled == 0:
        raise RuntimeError("the run reported no commits")
    previous: dict[int, float] = {}
    batches = []
    done_shuffle = done_input = 0
    for i, c in enumerate(commits):
        done_shuffle += c["rows"]
        covered = round(done_shuffle * input_rows / shuffled)
        start = previous.get(c["r"], launch)
        previous[c["r"]] = c["t"]
        batches.append(BatchRecord(i, covered - done_input, start, c["t"]))
        done_input = covered
    return batches


def expected_results(workload: Workload, kind: str, opts: MillstreamOptions) -> pa.Table:
    """What :func:`read_results` must return for ``kind`` over ``workload``."""
    if kind == "keyed_sum":
        return workload.expected_sum()
    if kind == "counters":
        return workload.expected_counters(opts.counters)
    return workload.expected_smallest()


def _read_range(store: Any, prefix: tuple[str, ...], page: int = 100_000) -> list[Any]:
    """Every ``(key, value)`` under ``prefix`` of a finished run, a page per transaction:
    millions of keys take longer to read than FoundationDB's 5 s allow one transaction."""
    end = (*prefix[:-1], prefix[-1] + "\x00")  # past every key that extends ``prefix``
    pairs: list[Any] = []
    begin: tuple[Any, ...] = prefix
    while True:
        with store.read() as txn:
            got = txn.get_range(begin, end, limit=page, snapshot=True)
        full = len(got) == page
        if pairs and got and got[0][0] == pairs[-1][0]:
            got = got[1:]  # a page starts at the previous page's last key
        pairs.extend(got)
        if not full:
            return [(k, v) for k, v in pairs if k != prefix]  # its extensions only
        begin = pairs[-1][0]


def _read_counters(store: Any, opts: MillstreamOptions) -> pa.Table:
    """``key`` and each counter, from the ``counters`` job's output (either layout)."""
    from millstream.state import decode_int64s

    from bench.millstream_jobs import KEYSPACE

    counters = counter_names(opts.counters)
    pairs = _read_range(store, ("out", KEYSPACE))
    lanes = [decode_int64s(v, len(counters)) for _, v in pairs]
    table = pa.table(
        {
            "key": pa.array([k[-1] for k, _ in pairs], pa.int64()),
            **{c: pa.array([v[i] for v in lanes], pa.int64()) for i, c in enumerate(counters)},
        }
    )
    return table.sort_by("key")


def read_results(
    run_dir: Path, kind: str, opts: MillstreamOptions | None = None, store: str | None = None
) -> pa.Table:
    """The processor's output as ``key, total``, ``key, count, s0, s1, s2`` or ``key`` and
    the counters, by key."""
    from millstream.state import decode_int64, open_store
    from millstream.state.limits import StoreLimits

    # A finished run, read page by page; a page of many keys may take longer than the 5 s
    # a transaction of the job may run.
    opened = open_store(
        store or f"sqlite:///{run_dir / 'state.db'}",
        prefix=(NAME,),
        limits=StoreLimits(max_transaction_seconds=3600.0),
    )
    try:
        if kind == "counters":
            return _read_counters(opened, opts or MillstreamOptions())
        if kind == "keyed_sum":
            pairs = _read_range(opened, ("out", "sum"))
            return pa.table(
                {
                    "key": pa.array([k[-1] for k, _ in pairs], pa.int64()),
                    "total": pa.array([decode_int64(v) for _, v in pairs], pa.int64()),
                }
            )
        counts = {k[-1]: v for k, v in _read_range(opened, ("out", "count"))}
        smallest = _read_range(opened, ("out", "smallest"))
    finally:
        opened.close()
    keys = [k[-1] for k, _ in smallest]
    kept = [(v.decode().split(SEPARATOR) + [None] * SMALLEST)[:SMALLEST] for _, v in smallest]
    payload = SCHEMA.field("payload").type
    columns: dict[str, pa.Array] = {
        "key": pa.array(keys, pa.int64()),
        "count": pa.array([decode_int64(counts[k]) for k in keys], pa.int64()),
    }
    for rank in range(SMALLEST):
        columns[f"s{rank}"] = pa.array([row[rank] for row in kept], payload)
    return pa.table(columns)


def measure(
    workload: Workload,
    kind: str,
    opts: MillstreamOptions | None = None,
    *,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Run ``kind`` (``keyed_sum``, ``smallest`` or ``counters``) through millstream and
    measure it.

    Returns:
        The measured figures; ``verified["ok"]`` says whether every key matched.

    Raises:
        MillstreamUnavailable: The millstream package cannot be imported.
    """
    if kind not in WORKLOADS:
        raise ValueError(f"unknown workload {kind!r}; choose from {WORKLOADS}")
    try:
        import millstream  # noqa: F401
    except ImportError as exc:
        raise MillstreamUnavailable(f"cannot import millstream ({exc})") from exc
    opts = opts or MillstreamOptions()
    runs = RESULTS / opts.system / "runs"
    expected = expected_results(workload, kind, opts)
    load_before = loadavg()
    run_dir = runs / f"{kind}-{workload.spec.rows}"
    launch, commits, report, _, summary = run_child(
        workload, kind, opts, run_dir, write_output=True, log=log
    )
    load_after = loadavg()
    log(f"    verifying {expected.num_rows:,} keys")
    verification = compare(expected, read_results(run_dir, kind, opts, opts.store))
    written = {
        "total": report.write_bytes + report.extra["store_server_bytes"],
        "store_server": report.extra["store_server_bytes"],
        "net": report.net_write_bytes,
        "wchar": report.wchar,
        "wait4_oublock": report.wait4_oublock_bytes or 0,
        "store_files": sum(f.stat().st_size for f in run_dir.glob("state.db*")),
    }
    settings: dict[str, Any] = {
        **asdict(opts),
        "partitions": workload.spec.partitions,
        "rows_per_file": workload.spec.rows_per_file,
        "commits": len(commits),
        "summary": summary,
        "wait4_cpu_s": report.wait4_cpu_seconds,
        "process_cpu": [
            {
                "name": p.name,
                "cmd": p.cmdline[:100],
                "cpu_s": p.cpu_ticks / os.sysconf("SC_CLK_TCK"),
            }
            for p in report.processes
        ],
        "process_writes": [
            {"name": p.name, "cmd": p.cmdline[:100], "write_bytes": p.written}
            for p in report.processes
            if p.written
        ],
    }
    if opts.bookkeeping_run:
        log("    again without output writes: the bookkeeping alone")
        _, quiet_commits, quiet, _, quiet_summary = run_child(
            workload,
            kind,
            opts,
            runs / f"{kind}-{workload.spec.rows}-bookkeeping",
            write_output=False,
            log=log,
        )
        written["state"] = quiet.write_bytes + quiet.extra["store_server_bytes"]
        written["output"] = max(0, written["total"] - written["state"])
        settings["bookkeeping_run"] = {"commits": len(quiet_commits), "summary": quiet_summary}
    return RunResult(
        system=opts.system,
        workload=kind,
        rows=workload.spec.rows,
        input_bytes=workload.input_bytes,
        parquet_bytes=workload.parquet_bytes,
        launch=launch,
        batches=_batches(commits, launch, workload.spec.rows),
        written=written,
        peak_rss_bytes=report.peak_rss_bytes,
        peak_pss_bytes=report.peak_pss_bytes,
        cpu_seconds=report.cpu_seconds,
        verified={"ok": verification.ok, "summary": verification.summary()},
        settings=settings,
        load=[load_before, load_after],
    )


def add_millstream_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``MillstreamOptions`` fields as command-line options."""
    d = MillstreamOptions()
    parser.add_argument("--num-reducers", type=int, default=d.num_reducers)
    parser.add_argument(
        "--batch-rows", type=int, default=d.batch_rows, help="default: Tuning's default"
    )
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=d.commit_interval_seconds,
        help="default: Tuning's default",
    )
    parser.add_argument(
        "--runner",
        choices=("local", "spark"),
        default=d.runner,
        help="run the workers as local processes or as the tasks of one Spark job",
    )
    parser.add_argument(
        "--counters",
        type=int,
        choices=COUNTER_CHOICES,
        default=d.counters,
        help="counters per key (workload counters)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=d.layout,
        help="counters workload: one output keyspace for all reducers, or one per reducer",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="the state store's URL (fdb://<cluster file>, emptied first); default: SQLite "
        "in the run directory",
    )
    parser.add_argument(
        "--store-pid",
        type=int,
        action="append",
        default=[],
        help="a process serving the store (fdbserver): its writes count (repeatable)",
    )
    parser.add_argument(
        "--no-bookkeeping-run",
        action="store_true",
        help="skip the run without output writes (no state/output split)",
    )


def options_from_args(args: argparse.Namespace) -> MillstreamOptions:
    """A ``MillstreamOptions`` from options added by :func:`add_millstream_arguments`."""
    return MillstreamOptions(
        num_reducers=args.num_reducers,
        batch_rows=args.batch_rows,
        commit_interval_seconds=args.commit_interval,
        bookkeeping_run=not args.no_bookkeeping_run,
        runner=args.runner,
        counters=args.counters,
        layout=args.layout,
        store=args.store,
        store_pids=tuple(args.store_pid),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="keyed_sum")
    add_spec_arguments(parser)
    add_millstream_arguments(parser)
    args = parser.parse_args()
    workload = generate(spec_from_args(args), args.data_root, verbose=True)
    result = measure(workload, args.workload, options_from_args(args))
    result.save(RESULTS / result.system / f"{args.workload}-{workload.spec.rows}.json")
    print_result(result)
    if not result.verified["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
