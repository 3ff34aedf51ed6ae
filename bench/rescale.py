"""Rescale cost on a bounded log: the README's keyed sum stopped part-way and rescaled to
another number of reducers (:mod:`bench.rescale_stream` does the same on a stream).

The job (:mod:`examples.keyed_sum`, default ``Tuning``) runs with ``--from`` reducers for
``--stop-after`` seconds and is stopped (SIGTERM to every worker, as Ctrl-C does). Then,
measured from the moment the last worker is gone:

* the rescale (:func:`millstream.rescale`): its wall time, the input rows its old
  reducers' run committed (up to the last row any of them had committed), and the bytes
  its process tree wrote to disk (gross and net, :mod:`bench.io_meter`), per input byte of
  the job; the handover transaction's own size (the keys and values it writes);
* the time from the stop to the first commit of the new shape (the processor started
  again with ``--to`` reducers; its first reducer commit seen in the store).

The run then drains and the sums are checked against the input. Run::

    .venv/bin/python -m bench.rescale --rows 20000000 --from 2 --to 3

Raw results: ``bench/results/rescale/*.json``.
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
import pyarrow.dataset as ds
from millstream.ledger import OUTPUT, reduced_key, summarize
from millstream.runner.local import LocalRunner
from millstream.state import decode_int64

from bench.io_meter import measure_callable
from examples.keyed_sum import generate, make_processor

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


def _check(processor: ms.Processor, data: Path) -> None:
    table = ds.dataset(data, format="parquet").to_table(columns=["key", "value"])
    want = table.group_by("key").aggregate([("value", "sum")])
    expected = dict(zip(want["key"].to_pylist(), want["value_sum"].to_pylist(), strict=True))
    store = processor.open_store()
    try:
        with store.read() as txn:
            got = {
                key[-1]: decode_int64(value)
                for key, value in txn.get_range_startswith((*OUTPUT, "sum"))
            }
    finally:
        store.close()
    assert got == expected, "the sums differ from the input's"


def measure_rescale(before: ms.Processor, to: int, stop_after: float) -> dict[str, Any]:
    """Run ``before`` for ``stop_after`` seconds, stop it, rescale it to ``to`` reducers
    (measured from the moment the last worker is gone) and run the new shape to the end.

    Returns the figures: rows persisted at the stop, the rescale's seconds, its old shape's
    run (seconds, rows), the bytes its process tree wrote, the handover transaction's size,
    the time from the stop to the new shape's first commit (None: it had nothing left to
    commit) and the final run's summary (``"final"``, a :class:`~millstream.RunSummary`).
    """
    runner = LocalRunner(before)
    runner.start()
    started = time.monotonic()
    while time.monotonic() - started < stop_after:
        assert not runner.poll(), "the job drained before it could be stopped"
        time.sleep(0.01)
    runner.stop()
    persisted = _persisted(before)
    stopped = time.monotonic()
    after = dataclasses.replace(before, num_reducers=to)
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
    return {
        "from": before.num_reducers,
        "to": to,
        "stopped_at_rows": persisted,
        "rescale_seconds": round(rescaled - stopped, 3),
        "drain_seconds": round(summary.drain_seconds, 3),
        "rows_drained": summary.rows_drained,
        # None: the cut was the input's end (the old shape's run did the rest of the job).
        "stop_to_first_commit_seconds": (
            None if first_commit is None else round(first_commit - stopped, 3)
        ),
        "rescale_write_bytes": io.write_bytes,
        "rescale_net_write_bytes": io.net_write_bytes,
        "handover_transaction_bytes": summary.handover_bytes,
        "final": runner.finish(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="millstream-rescale-"))
    try:
        data = generate(root, args.rows)
        input_bytes = sum(f.stat().st_size for f in data.rglob("*.parquet"))
        before = make_processor(root, args.rows, num_reducers=getattr(args, "from"))
        result = measure_rescale(before, args.to, args.stop_after)
        assert result["stopped_at_rows"] < args.rows, (
            "the job drained before it was stopped: use more rows"
        )
        _check(dataclasses.replace(before, num_reducers=args.to), data)
        return {
            "rows": args.rows,
            "input_bytes": input_bytes,
            **result,
            "rescale_bytes_per_input_byte": round(result["rescale_write_bytes"] / input_bytes, 5),
            "final": str(result["final"]),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--from", type=int, default=2, help="reducers before the rescale")
    parser.add_argument("--to", type=int, default=3, help="reducers after the rescale")
    parser.add_argument(
        "--stop-after", type=float, default=0.5, help="stop the job after this many seconds"
    )
    args = parser.parse_args()
    result = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"rescale-{args.rows}-{getattr(args, 'from')}-{args.to}-{int(time.time())}.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
