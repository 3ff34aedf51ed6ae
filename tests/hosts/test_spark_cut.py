"""A Spark standalone cluster across hosts (master and driver on one, a Spark worker on each
of two others) running a keyed sum, cut while it runs (:mod:`tests.support.hosts.spark_cut`
says what holds during each cut and why): on SQLite, a worker host cut from the driver's
host; on FoundationDB on a host of its own (the run not ``single_host``), that cut and a
worker host cut from the store's host, in a seeded order. The sums stay exact, every
planned cut lands, and the run drains within ``DRAIN_SECONDS`` of the last heal. More
seeds: ``python -m tests.support.hosts.soak --jobs spark [--store fdb]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fdb_cluster import FdbBinaries
from tests.support.hosts.apart import call_apart
from tests.support.hosts.spark_cut import SparkCut, SparkCutResult, run_spark_cut
from tests.support.spark_standalone import require_spark

pytestmark = [pytest.mark.usefixtures("root"), pytest.mark.spark, pytest.mark.slow]


def _replaced_elsewhere(result: SparkCutResult, cut: SparkCut) -> None:
    """Every millstream worker of the host cut from the driver was started again on the
    other host while the cut lasted (Spark lost the executor), and Spark said why."""
    assert sorted(w for w, _, _ in cut.relaunched) == sorted(f"{r} {i}" for r, i in cut.workers)
    assert all(host != cut.host for _, host, _ in cut.relaunched)
    assert result.restarts >= len(cut.relaunched)
    assert result.spark.get("driver lost an executor", 0) >= 1


def test_a_worker_host_cut_from_the_driver_is_replaced_and_the_sums_stay_exact(
    tmp_path: Path,
) -> None:
    require_spark()
    result = run_spark_cut(tmp_path, seed=1)
    print(result)
    [cut] = result.cuts
    _replaced_elsewhere(result, cut)


@pytest.mark.fdb
def test_on_foundationdb_worker_hosts_cut_from_the_driver_and_from_the_store_stay_exact(
    tmp_path: Path, fdb_binaries: FdbBinaries
) -> None:
    require_spark()
    # In an interpreter of its own: it reads the store from the driver's host (apart.py).
    result = call_apart(run_spark_cut, tmp_path, 2, store="fdb", timeout=900)
    print(result)
    cuts = {cut.kind: cut for cut in result.cuts}
    assert sorted(cuts) == ["worker_from_driver", "worker_from_store"]
    _replaced_elsewhere(result, cuts["worker_from_driver"])
    # Spark saw nothing wrong with the host cut from the store: no worker moved. The
    # reducers there committed nothing while it lasted (no replaced instance of theirs
    # lived on elsewhere to commit for them); those on the other host (if any) went on
    # committing, from both hosts' mappers.
    store_cut = cuts["worker_from_store"]
    assert not store_cut.relaunched
    if store_cut.old_alive_at_cut == 0:
        assert store_cut.commits.get("on the cut host", 0) == 0
    if "on the other host" in store_cut.commits:
        assert store_cut.commits["on the other host"] > 0
