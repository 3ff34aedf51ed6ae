"""Rescale cost on a stream: the pipeline of :mod:`bench.latency` (a producer appending to a
store-backed queue at ``--rate`` rows/s, default ``Tuning``) runs with ``--reducers``
reducers for ``--before`` seconds, is stopped (every worker, as Ctrl-C does) while the
producer keeps appending, rescaled to ``--to`` reducers (:func:`millstream.rescale`) and
started again; the producer goes on for ``--after`` seconds more, then the run drains and
every key's sum is checked against the producer's.

Reported: the rescale's wall time and the rows its old reducers' run committed, the bytes
its processes wrote to disk (gross and net, :mod:`bench.io_meter`; the producer's appends
meanwhile are counted apart) against the bytes appended meanwhile, the handover
transaction's size, and the time from the stop to the first commit of the new shape.
Run::

    .venv/bin/python -m bench.rescale_stream --rate 62500 --reducers 2 --to 3

Raw results: ``bench/results/rescale/stream-*.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import millstream as ms
from millstream.ledger import reduced_key
from millstream.state import decode_int64

from bench.io_meter import measure_callable
from bench.pipeline_args import add_pipeline_arguments, make_pipeline
from bench.queue_pipeline import Pipeline, log
from bench.queue_producer import ROW_BYTES, ProducerPlan, Step

RESULTS = Path(__file__).resolve().parent / "results" / "rescale"


def _commits(pipeline: Pipeline) -> int:
    txn = pipeline._store.create_transaction()
    try:
        raw = [txn.get(reduced_key(r, "commits")) for r in range(pipeline.num_reducers)]
    finally:
        txn.reset()
    return sum(decode_int64(v) for v in raw if v is not None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    label = f"stream-{args.reducers}-to-{args.to}-{args.rate:g}"
    pipeline = make_pipeline(args, label)
    try:
        pipeline.start(timeout=args.before + args.after + 900)
        producer = pipeline.producer(
            ProducerPlan(
                steps=(Step(args.before + args.after, args.rate),),
                tick_seconds=args.tick,
                keys=args.keys,
            )
        )
        time.sleep(args.before)
        assert pipeline.runner is not None
        pipeline.runner.stop()
        stopped = time.monotonic()
        log(f"  stopped after {args.before} s; rescaling to {args.to} reducers")
        appended_before = sum(pipeline.queue_ends())
        rescaled = dataclasses.replace(pipeline.processor, num_reducers=args.to)
        summary, io = measure_callable(lambda: ms.rescale(rescaled))
        appended_during = sum(pipeline.queue_ends()) - appended_before
        producer_pid = producer.process.pid
        written = io.group(lambda p: "producer" if p.pid == producer_pid else "rescale")
        rescale_io = written.get("rescale", {"write_bytes": 0, "net_write_bytes": 0})
        pipeline.processor = rescaled
        # The benchmark's reducers count their rows under ("rows", reducer index): the
        # check reads the old reducers' counters too.
        pipeline.num_reducers = max(args.reducers, args.to)
        pipeline._done.clear()
        pipeline._error = None
        commits = _commits(pipeline)
        pipeline.start(timeout=args.after + 900)
        while _commits(pipeline) == commits:
            assert pipeline.failed() is None, pipeline.failed()
            time.sleep(0.002)
        first_commit = time.monotonic()
        log(f"  {summary}; first commit {first_commit - stopped:.2f} s after the stop")
        produced = producer.result()
        pipeline.wait(900)
        verified = pipeline.verify(produced)
        log(f"  {verified['summary']}")
        assert verified["ok"], verified
        return {
            "label": label,
            "rate": args.rate,
            "from": args.reducers,
            "to": args.to,
            "rescale_seconds": round(summary.seconds, 3),
            "drain_seconds": round(summary.drain_seconds, 3),
            "rows_drained": summary.rows_drained,
            "stop_to_first_commit_seconds": round(first_commit - stopped, 3),
            # The rescale's processes only (the producer appending meanwhile is not counted).
            "rescale_write_bytes": rescale_io["write_bytes"],
            "rescale_net_write_bytes": rescale_io["net_write_bytes"],
            "bytes_appended_during_rescale": appended_during * ROW_BYTES,
            "handover_transaction_bytes": summary.handover_bytes,
            "rows_appended": produced.rows,
            "verified": verified["summary"],
        }
    finally:
        pipeline.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=62_500)
    parser.add_argument("--before", type=float, default=10.0)
    parser.add_argument("--after", type=float, default=10.0)
    parser.add_argument("--to", type=int, default=3, help="reducers after the rescale")
    add_pipeline_arguments(parser)
    args = parser.parse_args()
    result = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{result['label']}-{int(time.time())}.json").write_text(
        json.dumps(result, indent=2)
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
