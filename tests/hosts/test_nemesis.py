"""The nemesis over seeds on the keyed sum: every cut lands in every seed, every seed's sums
are exact and the run drains within ``DRAIN_SECONDS`` of the final heal. The longer soak
(more seeds, windows and a queue pipeline too): ``python -m tests.hosts.soak``."""

from __future__ import annotations

from pathlib import Path

import pytest
from nemesis import CUTS
from scenario import run_seed

pytestmark = pytest.mark.usefixtures("root")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_keyed_sum_is_exact_under_the_nemesis(tmp_path: Path, seed: int) -> None:
    result = run_seed("keyed_sum", seed, tmp_path)
    assert result.cuts.count("landed") == len(CUTS)
    print(result)
