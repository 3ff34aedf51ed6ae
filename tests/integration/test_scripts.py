"""Jobs defined in a script run as written: ``python job.py`` with or without a main guard,
and ``millstream run job.py:processor``, all three on one store.

The script is the README's twenty-line example, run by this interpreter in an empty
directory that holds only ``job.py`` and its ``data/``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.readme import ROOT, examples, localized, sums_in, write_data


def _readme_job() -> str:
    jobs = [e.code for e in examples(ROOT / "README.md") if e.lang == "python" and e.skip is None]
    assert jobs, "the README has no job example"
    return jobs[0]


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The timeout only keeps a crash-looping run from hanging the suite.
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )


def _guarded(code: str) -> str:
    lines = code.rstrip("\n").splitlines()
    assert lines[-1].startswith("print(ms.run_local(processor")
    return "\n".join([*lines[:-1], 'if __name__ == "__main__":', f"    {lines[-1]}", ""])


def test_script_runs_with_and_without_main_guard_and_from_the_cli(tmp_path: Path) -> None:
    expected = write_data(tmp_path)
    code = localized(_readme_job(), tmp_path)
    store = re.search(r'store="(sqlite://[^"]+)"', code)
    assert store is not None

    (tmp_path / "job.py").write_text(code)  # as written: no main guard
    first = _python("job.py", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "drained: 6,000 rows read" in first.stdout
    assert ", 0 restarts" in first.stdout
    assert sums_in(store[1]) == expected

    # The same job behind a main guard, and through the command line, on the same store:
    # one identity however the module was imported; a rerun adds nothing.
    (tmp_path / "job.py").write_text(_guarded(code))
    guarded = _python("job.py", cwd=tmp_path)
    assert guarded.returncode == 0, guarded.stderr
    assert "drained: 6,000 rows read" in guarded.stdout
    cli = _python("-m", "millstream", "run", "job.py:processor", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "drained: 6,000 rows read" in cli.stdout
    assert sums_in(store[1]) == expected


def test_guarded_script_on_a_new_store(tmp_path: Path) -> None:
    expected = write_data(tmp_path)
    code = _guarded(localized(_readme_job(), tmp_path))
    (tmp_path / "job.py").write_text(code)
    run = _python("job.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "drained: 6,000 rows read" in run.stdout
    store = re.search(r'store="(sqlite://[^"]+)"', code)
    assert store is not None
    assert sums_in(store[1]) == expected


def test_a_guardless_job_imported_by_another_program_stops_with_what_to_do(
    tmp_path: Path,
) -> None:
    write_data(tmp_path)
    (tmp_path / "job.py").write_text(localized(_readme_job(), tmp_path))
    (tmp_path / "other.py").write_text("import job\n")
    # Workers import the job's module, whose top level starts the run again; before, each
    # worker (and fork server) started runs of its own, without end.
    run = _python("other.py", cwd=tmp_path)
    assert run.returncode != 0
    assert "a run was started inside a worker process" in run.stderr
    assert 'if __name__ == "__main__":' in run.stderr
