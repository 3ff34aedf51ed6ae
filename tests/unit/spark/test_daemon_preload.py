"""What millstream's PySpark daemon imports before it forks: millstream's workers, pyarrow,
and the job's modules named in its environment (one that fails to import is skipped)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import millstream as ms
import pytest
from millstream.runner.forkserver import PRELOAD_ENV, user_modules

from tests.support.spark_jobs import make_processor

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import json, sys
import millstream.spark.daemon as daemon
before = sorted(m for m in ("examples.keyed_sum", "pyarrow.acero") if m in sys.modules)
daemon.preload()
print(json.dumps({
    "before": before,
    "after": [m for m in (*daemon.PRELOAD, "examples.keyed_sum") if m in sys.modules],
    "expected": [*daemon.PRELOAD, "examples.keyed_sum"],
}))
"""


def test_preload_imports_the_workers_modules_and_the_jobs(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    processor, _ = make_processor(tmp_path)
    env = {
        **os.environ,
        PRELOAD_ENV: f"{user_modules(processor)},tests_no_such_module",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] == []  # nothing of it until preload
    assert seen["after"] == seen["expected"]


def test_user_modules_leave_out_scripts(tmp_path: Path) -> None:
    processor, _ = make_processor(tmp_path)
    assert user_modules(processor) == "examples.keyed_sum"

    class Script(ms.Mapper):
        def map(self, batch: object) -> ms.Partitioned:
            raise NotImplementedError

    Script.__module__ = "__main__"
    assert user_modules(dataclasses.replace(processor, mapper=Script)) == "examples.keyed_sum"
