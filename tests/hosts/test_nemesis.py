"""The nemesis over seeds on the keyed sum: every cut lands in every seed, every seed's sums
are exact and the run drains within ``DRAIN_SECONDS`` of the final heal. The longer soak
(more seeds, panes and a queue pipeline too): ``python -m tests.support.hosts.soak``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hosts.cluster import has_foundationdb
from tests.support.hosts.nemesis import CUTS
from tests.support.hosts.scenario import run_seed

pytestmark = pytest.mark.usefixtures("root")

HERE = Path(__file__).resolve().parent

# The FoundationDB seed in an interpreter of its own: FoundationDB's client runs one network
# thread per process, in the network namespace where the process first opened a database.
# Earlier tests of this session opened the session's cluster from the root namespace, so
# this process could not reach a store on a host of its own; a fresh process first opens it
# from the driver's host, as a driver on that host would.
_FDB_SEED = """
import millstream
from pathlib import Path
from tests.support.hosts.nemesis import CUTS
from tests.support.hosts.scenario import run_seed

result = run_seed("keyed_sum", 6, Path({directory!r}), store="fdb")
print(result)
assert result.cuts.count("landed") == len(CUTS) + 1, result.cuts
assert "from the store's host" in result.cuts, result.cuts
"""


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
    paths = [str(HERE.parent.parent)]
    inherited = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, *([inherited] if inherited else [])]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _FDB_SEED.format(directory=str(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout)
    assert done.returncode == 0, f"the seed failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
