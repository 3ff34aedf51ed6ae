"""The nemesis over seeds on the keyed sum: every cut lands in every seed, every seed's sums
are exact and the run drains within ``DRAIN_SECONDS`` of the final heal. The longer soak
(more seeds, windows and a queue pipeline too): ``python -m tests.hosts.soak``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster import has_foundationdb
from nemesis import CUTS
from scenario import run_seed

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
    tmp_path: Path,
) -> None:
    if not has_foundationdb():
        pytest.skip("no FoundationDB binaries ($MILLSTREAM_FDB_HOME or ../shared/fdb)")
    result = run_seed("keyed_sum", 6, tmp_path, store="fdb")
    assert result.cuts.count("landed") == len(CUTS) + 1
    assert "from the store's host" in result.cuts
    print(result)
