"""The nemesis over seeds on the keyed sum: every cut lands in every seed, every seed's sums
are exact and the run drains within ``DRAIN_SECONDS`` of the final heal. The longer soak
(more seeds, panes and a queue pipeline too): ``python -m tests.support.hosts.soak``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fdb_cluster import FdbBinaries
from tests.support.hosts.apart import call_apart
from tests.support.hosts.nemesis import CUTS
from tests.support.hosts.scenario import run_seed

pytestmark = pytest.mark.usefixtures("root")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_keyed_sum_is_exact_under_the_nemesis(tmp_path: Path, seed: int) -> None:
    result = run_seed("keyed_sum", seed, tmp_path)
    assert result.cuts.count("landed") == len(CUTS)
    print(result)


@pytest.mark.slow
@pytest.mark.fdb
def test_keyed_sum_on_foundationdb_on_its_own_host_is_exact_under_the_nemesis(
    tmp_path: Path, fdb_binaries: FdbBinaries
) -> None:
    # In an interpreter of its own: it reads the store from the driver's host (apart.py).
    result = call_apart(run_seed, "keyed_sum", 6, tmp_path, store="fdb", timeout=900)
    print(result)
    assert result.cuts.count("landed") == len(CUTS) + 1, result.cuts
    assert "from the store's host" in result.cuts, result.cuts
