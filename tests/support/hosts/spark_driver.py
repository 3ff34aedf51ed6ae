"""The driver of a Spark run on hosts of their own, started inside the master's host by
:func:`tests.support.hosts.spark_cluster.start_driver`:

    python -m tests.support.hosts.spark_driver SPEC.json

It starts a SparkSession with the spec's settings, waits until every worker host's executor
registered (so that the tasks spread over all of them), runs the pickled processor with
``millstream.spark.run(..., single_host=...)`` as the spec says (``True`` for the SQLite
store, a file every host shares; ``False`` for FoundationDB on a host of its own) and
writes the run's summary as JSON. Spark's warnings (lost executors, failed
tasks) go to its log.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
import time
from pathlib import Path

import millstream as ms
from millstream.spark import run

EXECUTOR_WAIT_SECONDS = 120.0


def main(spec_path: str) -> int:
    from pyspark.sql import SparkSession

    spec = json.loads(Path(spec_path).read_text())
    builder = SparkSession.builder.appName("millstream-on-hosts")
    for key, value in spec["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        sc = spark.sparkContext
        sc.setLogLevel("WARN")
        processor: ms.Processor = pickle.loads(Path(spec["processor"]).read_bytes())
        give_up = time.monotonic() + EXECUTOR_WAIT_SECONDS
        while len(sc.statusTracker().getExecutorInfos()) < spec["executors"] + 1:  # + driver
            if time.monotonic() > give_up:
                print("not every worker host's executor registered", file=sys.stderr)
                return 1
            time.sleep(0.2)
        summary = run(spark, processor, single_host=spec["single_host"], timeout=spec["timeout"])
        Path(spec["result"]).write_text(json.dumps(dataclasses.asdict(summary)))
        print(summary, flush=True)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
