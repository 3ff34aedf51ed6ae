"""The Spark runner reading a Kafka topic: the keyed sum on ``local[2]`` (one mapper for
the topic's partition, one reducer), exact."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import millstream as ms
import pytest

from tests.support.jobs import KeyedSumReducer, read_output
from tests.support.kafka_broker import new_topic
from tests.support.kafka_jobs import PackedKeyedSumMapper, fill_keyed

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A SparkSession on ``local[2]`` whose Python workers import this directory's jobs."""
    pytest.importorskip("pyspark")
    if not os.environ.get("JAVA_HOME") and not any(
        (Path(p) / "java").exists() for p in os.environ.get("PATH", "").split(os.pathsep)
    ):
        pytest.skip("no JDK: run scripts/install-system-deps.sh")
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    here = str(Path(__file__).resolve().parent)
    paths = [here, str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("millstream-kafka-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "512m")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def test_spark_runner_reads_a_topic_exactly(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from millstream.spark import run

    name = new_topic(kafka_bootstrap, 1)
    sums = fill_keyed(kafka_bootstrap, name, 20_000, 1, packed=True, seed=9)
    processor = ms.Processor(
        mapper=PackedKeyedSumMapper,
        reducer=KeyedSumReducer,
        input=ms.inputs.KafkaTopic(kafka_bootstrap, name, bounded=True),
        store=f"sqlite:///{tmp_path / 'state.db'}",
        num_reducers=1,
        tuning=ms.Tuning(batch_rows=2_000, commit_interval_seconds=0.1, heartbeat_seconds=0.2),
    )
    summary = run(spark, processor, timeout=240)
    assert summary.rows_read == 20_000
    assert read_output(processor, "sum") == dict(sums)
