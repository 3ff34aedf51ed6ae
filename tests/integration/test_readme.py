"""The README cannot drift: every Python and shell example in it runs, on small data.

The examples are extracted in order and run in an empty temporary directory holding only a
``data/`` directory of Parquet partitions: a Python block that defines a processor becomes
``job.py`` (the next shell block runs it the ways the README says), a Python block of
tests (``def test_...``) runs under pytest, a shell block runs line by line. The one
change made to them: ``/tmp/`` paths move into the test's directory, so that runs never
share a store. A block that cannot run here says why, in a comment right above it:
``<!-- readme-test: skip: <reason> -->``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.readme import ROOT, Example, examples, localized, sums_in, write_data

DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md"]


def run_shell_line(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """One command of a shell block, with ``python`` being this interpreter."""
    argv = shlex.split(line, comments=True)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    # The caller's path after the repository root: a checkout's own package runs there.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


ALL = [example for doc in DOCS for example in examples(doc)]


@pytest.mark.parametrize("example", [e for e in ALL if e.skip is not None], ids=lambda e: e.id)
def test_skipped_examples_say_why(example: Example) -> None:
    assert len(example.skip or "") > 20, f"{example.id}: say why this example cannot run here"
    pytest.skip(f"{example.id}: {example.skip}")


def test_readme_runs_in_order(tmp_path: Path) -> None:
    expected = write_data(tmp_path)
    ran = []
    job_defined = False
    for example in examples(ROOT / "README.md"):
        if example.skip is not None:
            continue
        code = localized(example.code, tmp_path)
        if example.lang == "python" and "\ndef test_" in code:
            # A test of a job: run it with pytest, as its reader would.
            (tmp_path / "test_readme_job.py").write_text(code)
            result = run_shell_line(
                "python -m pytest -q -p no:cacheprovider test_readme_job.py", tmp_path
            )
            assert result.returncode == 0, f"{example.id}:\n{result.stdout}\n{result.stderr}"
            assert " passed" in result.stdout, f"{example.id}: {result.stdout}"
        elif example.lang == "python":
            assert "ms.Processor(" in code, f"{example.id}: a Python block that is not a job"
            (tmp_path / "job.py").write_text(code)
            job_defined = True
        elif example.lang in ("bash", "sh"):
            assert job_defined, f"{example.id}: a shell block before any job"
            for line in code.splitlines():
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                result = run_shell_line(line, tmp_path)
                assert result.returncode == 0, f"{example.id}: {line}\n{result.stderr}"
                if "status" in line and "--json" in line:
                    json.loads(result.stdout)
                if " run " in f" {line} " or line.startswith("python job.py"):
                    assert "drained:" in result.stdout, f"{example.id}: {line}\n{result.stderr}"
        else:
            pytest.fail(f"{example.id}: a {example.lang} block; mark it or make it runnable")
        ran.append(example.id)
    assert job_defined
    store = re.search(r'store="(sqlite://[^"]+)"', (tmp_path / "job.py").read_text())
    assert store is not None
    assert sums_in(store[1]) == expected
    assert len(ran) >= 2
