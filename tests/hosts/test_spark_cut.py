"""A Spark standalone cluster across hosts (master and driver on one, a Spark worker on each
of two others), and one worker host cut from the driver's host while a keyed sum runs:
Spark drops the executor, starts its tasks again on the other host, and the sums stay
exact; the run drains within ``DRAIN_SECONDS`` of the heal. More seeds:
``python -m tests.support.hosts.soak --jobs spark``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hosts.spark_cut import run_spark_cut
from tests.support.spark_standalone import require_spark

pytestmark = [pytest.mark.usefixtures("root"), pytest.mark.spark, pytest.mark.slow]


def test_a_worker_host_cut_from_the_driver_is_replaced_and_the_sums_stay_exact(
    tmp_path: Path,
) -> None:
    require_spark()
    result = run_spark_cut(tmp_path, seed=1)
    print(result)
    # Every millstream worker of the cut host was started again on the other host while
    # the cut lasted (Spark lost the executor), and Spark said why.
    assert result.relaunched
    assert all(host != result.cut_host for _, host, _ in result.relaunched)
    assert result.restarts >= len(result.relaunched)
    assert result.spark.get("driver lost an executor", 0) >= 1
