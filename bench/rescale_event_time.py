"""Rescale cost of an event-time aggregation: per tumbling minute and key, the count and sum
of :mod:`bench.event_time`' events (2 partitions, ``--keys`` keys, 5 s out of order), stopped
part-way and rescaled to another number of reducers.

The job (``ms.event_time``, default ``Tuning``, embedded SQLite store, results into a
Parquet sink) runs with ``--from`` reducers for ``--stop-after`` seconds and is stopped
(SIGTERM to every worker, as Ctrl-C does). Then, measured from the moment the last
worker is gone: the rescale's wall time, the input rows its old reducers' run committed,
the bytes its process tree wrote (gross and net, :mod:`bench.io_meter`), the handover
transaction's size, and the time from the stop to the first commit of the new shape. With
``--reducer stored`` (:class:`~millstream.event_time.PaneReducer`) open panes' partials
are in the store already, under their key groups: nothing moves. With ``--reducer
pending`` (:class:`~millstream.event_time.PendingPaneReducer`) they are pending in the
mappers' memory, and the old reducers store them, by key group, at the rescale's cut.

The run then drains and every pane is checked against pyarrow's. Run::

    .venv/bin/python -m bench.rescale_event_time --rows 10000000 --reducer pending

Raw results: ``bench/results/rescale/event_time-*.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import millstream as ms
from millstream.outputs import ParquetSink

from bench.event_time import REDUCERS, expected, generate, input_bytes, per_minute
from bench.rescale import measure_rescale

RESULTS = Path(__file__).resolve().parent / "results" / "rescale"


def _processor(root: Path, data: Path, args: argparse.Namespace) -> ms.Processor:
    store = f"sqlite:///{root / 'state.db'}"
    return ms.Processor(
        mapper=ms.event_time.PaneMapper,
        reducer=getattr(ms.event_time, REDUCERS[args.reducer]),
        input=ms.inputs.ParquetLog(str(data)),
        store=store,
        num_reducers=getattr(args, "from"),
        name="panes",
        config={"panes": per_minute(args.disorder_ms)},
        outputs=[ParquetSink(store, "per-minute", str(root / "out"))],
    )


def _check(sink: ParquetSink, data: Path) -> int:
    """The panes the sink received equal pyarrow's; returns how many."""
    table = sink.read()
    got: dict[tuple[int, int], tuple[int, int]] = {}
    for s, k, n, v in zip(
        table["window_start"].to_pylist(),
        table["key"].to_pylist(),
        table["n"].to_pylist(),
        table["total"].to_pylist(),
        strict=True,
    ):
        assert (s, k) not in got, f"pane {s} of key {k} emitted twice"
        got[(s, k)] = (n, v)
    assert got == expected(data), "the panes differ from pyarrow's"
    return len(got)


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="millstream-rescale-event-time-"))
    try:
        data = generate(RESULTS.parent / "event_time" / "input", args)
        before = _processor(root, data, args)
        result = measure_rescale(before, args.to, args.stop_after)
        assert result["stopped_at_rows"] < args.rows, (
            "the job drained before it was stopped: use more rows"
        )
        sink = before.outputs[0]
        assert isinstance(sink, ParquetSink)
        return {
            "reducer": args.reducer,
            "rows": args.rows,
            "keys": args.keys,
            "panes": _check(sink, data),
            "input_bytes": input_bytes(data),
            **result,
            "exact": True,
            "final": str(result["final"]),
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
    # The event input's shape, as bench.event_time makes it.
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rate", type=int, default=1_000, help="events/s per partition")
    parser.add_argument("--disorder-ms", type=int, default=5_000)
    parser.add_argument("--file-rows", type=int, default=100_000)
    args = parser.parse_args()
    result = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    label = f"event_time-{args.reducer}-{getattr(args, 'from')}-to-{args.to}"
    (RESULTS / f"{label}-{int(time.time())}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
