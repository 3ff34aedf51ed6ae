"""``spark-submit examples/spark_keyed_sum.py`` as the README documents it (local master)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spark_standalone import require_spark, spark_submit

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def test_spark_submit_runs_the_example(tmp_path: Path) -> None:
    require_spark()
    done = spark_submit(
        ROOT / "examples" / "spark_keyed_sum.py",
        ["--conf", "spark.ui.enabled=false"],
        {"MILLSTREAM_EXAMPLE_DIR": str(tmp_path), "MILLSTREAM_EXAMPLE_ROWS": "20000"},
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rows differing from Spark's groupBy: 0" in done.stdout
    assert "on Spark: drained: 20,000 rows read" in done.stdout
