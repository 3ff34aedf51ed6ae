"""The measured child of :mod:`bench.millstream_runner`: runs one processor to the end.

A module of its own so that the child imports only millstream and the jobs (not the
benchmark's meters and data generator). With the local runner it starts the fork server
before anything else, as ``millstream run`` does: the server's imports overlap the
child's. With the Spark runner it starts a ``local[mappers + reducers]`` session (every
worker is a task, so every worker needs a slot) and runs the processor as one Spark job.

Run by the runner as ``python -m bench.millstream_child <workload> <input> <run dir>
<options JSON> [--no-output]``.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from millstream import Processor, RunSummary


def main(argv: list[str]) -> None:
    """Build the processor, run it until the input drains, write ``child.json``."""
    kind, input_dir, run_dir, options = argv[:4]
    settings = json.loads(options)
    runner = settings.pop("runner", "local")
    if runner == "local":
        from millstream.runner.forkserver import start_fork_server

        start_fork_server()
    from dataclasses import asdict
    from pathlib import Path

    from bench.millstream_jobs import build_processor

    processor = build_processor(
        Path(input_dir), kind, Path(run_dir), settings, write_output="--no-output" not in argv
    )
    if runner == "local":
        from millstream import run_local

        summary = run_local(processor, progress=False)
    elif runner == "spark":
        summary = _run_on_spark(processor, settings)
    else:
        raise SystemExit(f"unknown runner {runner!r}: local or spark")
    print(f"    {summary}", flush=True)
    (Path(run_dir) / "child.json").write_text(json.dumps(asdict(summary)))


def _run_on_spark(processor: Processor, settings: dict[str, Any]) -> RunSummary:
    """``processor`` as one Spark job on a local session with a slot per worker.

    ``settings["spark_conf"]``: more Spark settings of the session (such as
    ``spark.eventLog.dir``, ``spark.python.daemon.module``). The session's start and the
    call of :func:`millstream.spark.run` go to the benchmark's FIFO as events.
    """
    import time

    import millstream.spark as mss

    from bench.millstream_jobs import send

    spark = local_session(processor.num_mappers + processor.num_reducers, settings)
    send({"event": "session", "t": time.time()})
    try:
        return mss.run(spark, processor)
    finally:
        send({"event": "run returned", "t": time.time()})
        spark.stop()


def local_session(slots: int, settings: dict[str, Any]) -> Any:
    """The benchmarks' local Spark session: ``local[slots]``, no UI, 1 GB of driver memory,
    and ``settings["spark_conf"]``; its Python workers run this interpreter."""
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName("millstream benchmark")
        .master(f"local[{slots}]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
    )
    for key, value in settings.get("spark_conf", {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


if __name__ == "__main__":
    main(sys.argv[1:])
