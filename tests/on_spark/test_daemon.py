"""The keyed sum through Spark with millstream's PySpark daemon
(``spark.python.daemon.module=millstream.spark.daemon``): exact, its task workers forked by
that daemon, which imported millstream and the job's modules before it forked them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from millstream.spark import run, write_queue

from tests.support.spark_jobs import expected_sums, got_sums, make_processor, make_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def spark_conf() -> dict[str, str]:
    return {"spark.python.daemon.module": "millstream.spark.daemon"}


def test_keyed_sum_is_exact_with_millstreams_daemon(spark: Any, tmp_path: Path) -> None:
    processor, queue = make_processor(tmp_path)
    table = make_rows(20_000, seed=7)
    assert write_queue(spark.createDataFrame(table).repartition(3), queue, close=True) == 20_000

    summary = run(spark, processor, timeout=120)

    assert summary.rows_read == table.num_rows
    assert summary.restarts == 0
    assert got_sums(processor) == expected_sums(table)

    # The next job's workers come from the daemon the run's environment started.
    def _daemon_of_task(_rows: Any) -> Any:  # nested: pickled by value
        """The command line of the process that forked this task's Python worker, the
        preload variable of its environment, and whether it has pyarrow's library loaded."""
        import os

        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            command = [part.decode() for part in f.read().split(b"\0") if part]
        with open(f"/proc/{parent}/environ", "rb") as f:
            preload = [e.decode() for e in f.read().split(b"\0") if e.startswith(b"MILLSTREAM_PRE")]
        with open(f"/proc/{parent}/maps") as f:
            arrow = any("libarrow.so" in line for line in f)
        yield command, preload, arrow

    sc = spark.sparkContext
    seen = sc.parallelize(range(4), 4).mapPartitions(_daemon_of_task).collect()
    modules = f"MILLSTREAM_PRELOAD_MODULES={processor.mapper.__module__}"
    for command, preload, arrow in seen:
        assert "millstream.spark.daemon" in command, command
        assert preload == [modules]
        assert arrow, "the daemon forked the worker without pyarrow imported"
