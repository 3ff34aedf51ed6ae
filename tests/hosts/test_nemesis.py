"""The nemesis over seeds: every cut lands in every seed, every seed's keyed sum is exact
and drains after the final heal."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenario import run_keyed_sum

pytestmark = pytest.mark.usefixtures("root")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_keyed_sum_is_exact_under_the_nemesis(tmp_path: Path, seed: int) -> None:
    print(run_keyed_sum(seed, tmp_path))
