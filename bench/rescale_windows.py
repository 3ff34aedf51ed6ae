"""Rescale cost of a windowed aggregation: per tumbling minute and key, the count and sum
of :mod:`bench.windows`' events (2 partitions, ``--keys`` keys, 5 s out of order), stopped
part-way and rescaled to another number of reducers.

The job (``ms.windows``, default ``Tuning``, embedded SQLite store, results into a
Parquet sink) runs with ``--from`` reducers for ``--stop-after`` seconds and is stopped
(SIGTERM to every worker, as Ctrl-C does). Then, measured from the moment the last
worker is gone: the rescale's wall time, the input rows its old reducers' run committed,
the bytes its process tree wrote (gross and net, :mod:`bench.io_meter`), the handover
transaction's size, and the time from the stop to the first commit of the new shape. With
``--reducer stored`` (:class:`~millstream.windows.WindowReducer`) open windows' partials
are in the store already, under their key groups: nothing moves. With ``--reducer
pending`` (:class:`~millstream.windows.PendingWindowReducer`) they are pending in the
mappers' memory, and the old reducers store them, by key group, at the rescale's cut.

The run then drains and every window is checked against pyarrow's. Run::

    .venv/bin/python -m bench.rescale_windows --rows 10000000 --reducer pending

Raw results: ``bench/results/rescale/windows-*.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import millstream as ms
from millstream.ledger import reduced_key, summarize
from millstream.outputs import ParquetSink
from millstream.runner.local import LocalRunner
from millstream.state import decode_int64

from bench.io_meter import measure_callable
from bench.windows import MINUTE, REDUCERS, expected, generate, input_bytes

RESULTS = Path(__file__).resolve().parent / "results" / "rescale"


def _persisted(processor: ms.Processor) -> int:
    store = processor.open_store()
    try:
        return summarize(store, processor.info, 0, 0.0).rows_read
    finally:
        store.close()


def _commits(processor: ms.Processor) -> int:
    store = processor.open_store()
    try:
        with store.read() as txn:
            raw = [txn.get(reduced_key(r, "commits")) for r in range(processor.num_reducers)]
    finally:
        store.close()
    return sum(decode_int64(v) for v in raw if v is not None)


def _processor(root: Path, data: Path, args: argparse.Namespace) -> ms.Processor:
    store = f"sqlite:///{root / 'state.db'}"
    windows = ms.windows.Windows(
        time="ts",
        key="key",
        size=MINUTE,
        lateness=args.disorder_ms,
        aggregates={"n": (None, "count"), "total": ("value", "sum")},
        output="per-minute",
    )
    return ms.Processor(
        mapper=ms.windows.WindowMapper,
        reducer=getattr(ms.windows, REDUCERS[args.reducer]),
        input=ms.inputs.ParquetLog(str(data)),
        store=store,
        num_reducers=getattr(args, "from"),
        name="windows",
        config={"windows": windows},
        outputs=[ParquetSink(store, "per-minute", str(root / "out"))],
    )


def _check(sink: ParquetSink, data: Path) -> int:
    """The windows the sink received equal pyarrow's; returns how many."""
    table = sink.read()
    got: dict[tuple[int, int], tuple[int, int]] = {}
    for s, k, n, v in zip(
        table["window_start"].to_pylist(),
        table["key"].to_pylist(),
        table["n"].to_pylist(),
        table["total"].to_pylist(),
        strict=True,
    ):
        assert (s, k) not in got, f"window {s} of key {k} emitted twice"
        got[(s, k)] = (n, v)
    assert got == expected(data), "the windows differ from pyarrow's"
    return len(got)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="millstream-rescale-windows-"))
    try:
        data = generate(RESULTS.parent / "windows" / "input", args)
        before = _processor(root, data, args)
        runner = LocalRunner(before)
        runner.start()
        started = time.monotonic()
        while time.monotonic() - started < args.stop_after:
            assert not runner.poll(), "the job drained before it could be stopped"
            time.sleep(0.01)
        runner.stop()
        persisted = _persisted(before)
        assert persisted < args.rows, "the job drained before it was stopped: use more rows"
        stopped = time.monotonic()
        after = dataclasses.replace(before, num_reducers=args.to)
        summary, io = measure_callable(lambda: ms.rescale(after))
        rescaled = time.monotonic()
        commits = _commits(after)
        runner = LocalRunner(after)
        runner.start()
        first_commit: float | None = None
        while not runner.poll():
            if first_commit is None and _commits(after) > commits:
                first_commit = time.monotonic()
            time.sleep(0.005)
        final = runner.finish()
        sink = after.outputs[0]
        assert isinstance(sink, ParquetSink)
        windows = _check(sink, data)
        return {
            "reducer": args.reducer,
            "rows": args.rows,
            "keys": args.keys,
            "windows": windows,
            "from": getattr(args, "from"),
            "to": args.to,
            "stopped_at_rows": persisted,
            "input_bytes": input_bytes(data),
            "rescale_seconds": round(rescaled - stopped, 3),
            "drain_seconds": round(summary.drain_seconds, 3),
            "rows_drained": summary.rows_drained,
            "stop_to_first_commit_seconds": (
                None if first_commit is None else round(first_commit - stopped, 3)
            ),
            "rescale_write_bytes": io.write_bytes,
            "rescale_net_write_bytes": io.net_write_bytes,
            "handover_transaction_bytes": summary.handover_bytes,
            "exact": True,
            "final": str(final),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--reducer", choices=sorted(REDUCERS), default="pending")
    parser.add_argument("--from", type=int, default=2, help="reducers before the rescale")
    parser.add_argument("--to", type=int, default=3, help="reducers after the rescale")
    parser.add_argument(
        "--stop-after", type=float, default=2.0, help="stop the job after this many seconds"
    )
    # The event input's shape, as bench.windows makes it.
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rate", type=int, default=1_000, help="events/s per partition")
    parser.add_argument("--disorder-ms", type=int, default=5_000)
    parser.add_argument("--file-rows", type=int, default=100_000)
    args = parser.parse_args()
    result = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    label = f"windows-{args.reducer}-{getattr(args, 'from')}-to-{args.to}"
    (RESULTS / f"{label}-{int(time.time())}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
