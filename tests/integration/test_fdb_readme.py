"""The README's FoundationDB walk-through runs as written: the job with ``store="fdb://"``
on a cluster started by ``start-cluster.sh`` from ``$MILLSTREAM_FDB_HOME``, drained and exact.

The block runs in bash (it sets variables) in an empty directory holding the README's job
as ``fdb_job.py`` and its ``data/``; ``$PWD/../shared/fdb`` becomes the session's
FoundationDB folder and ``/tmp/`` the test's directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fdb_cluster import FdbBinaries
from tests.support.readme import ROOT, examples, localized, sums_in, write_data

pytestmark = pytest.mark.fdb


def _walk_through() -> str:
    blocks = [e.code for e in examples(ROOT / "README.md") if "start-cluster.sh" in e.code]
    assert len(blocks) == 1, "the README's FoundationDB walk-through"
    return blocks[0]


def _job() -> str:
    jobs = [
        e.code
        for e in examples(ROOT / "README.md")
        if 'store="sqlite:///tmp/keyed-sum.db"' in e.code
    ]
    return jobs[0].replace('store="sqlite:///tmp/keyed-sum.db"', 'store="fdb://"')


def test_the_readme_foundationdb_walk_through(tmp_path: Path, fdb_binaries: FdbBinaries) -> None:
    home = os.environ.get("MILLSTREAM_FDB_HOME")
    if home is None or not (Path(home) / "start-cluster.sh").is_file():
        pytest.skip("the walk-through uses start-cluster.sh from a FoundationDB folder")
    expected = write_data(tmp_path)
    (tmp_path / "fdb_job.py").write_text(_job())
    lines = localized(_walk_through(), tmp_path).replace("$PWD/../shared/fdb", home).splitlines()
    stop = lines.pop()
    assert stop.startswith("kill ")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FDB_CLUSTER_FILE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # python: this one
    script = "\n".join(["set -euo pipefail", *lines, 'echo "cluster=$FDB_CLUSTER_FILE"'])
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "drained:" in done.stdout
        cluster = done.stdout.rsplit("cluster=", 1)[1].strip()
        assert sums_in(f"fdb://{cluster}") == expected
    finally:
        subprocess.run(["bash", "-c", stop], cwd=tmp_path, check=False, timeout=60)
    assert not (tmp_path / "fdb-demo").exists()
