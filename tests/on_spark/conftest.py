"""A local Spark session per test module: ``local[4,3]`` (4 slots, each task tried 3 times).

Python workers run this interpreter and import the repository root (``examples``), and the
session is kept small: no UI, few shuffle partitions, a short task kill timeout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MASTER = "local[4,3]"


def _java_available() -> bool:
    if os.environ.get("JAVA_HOME"):
        return True
    return any((Path(p) / "java").exists() for p in os.environ.get("PATH", "").split(os.pathsep))


@pytest.fixture(scope="module")
def spark_conf() -> dict[str, str]:
    """More settings of the module's session (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
def spark(spark_conf: dict[str, str]) -> Iterator[Any]:
    """A SparkSession on ``local[4,3]`` with ``spark_conf``, stopped after the module."""
    pyspark = pytest.importorskip("pyspark")
    if not _java_available():
        pytest.skip("no JDK: run scripts/install-system-deps.sh")
    del pyspark
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    builder = (
        SparkSession.builder.master(MASTER)
        .appName("millstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.python.task.killTimeout", "1s")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in spark_conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
