"""Ctrl-C and SIGTERM stop a run within seconds, print the summary, leave no process
behind, and a rerun resumes exactly: with real signals, on ``millstream run`` and on a
script calling ``run_local``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.readme import JOB, sums_in, write_data


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (all a run started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("how", "signum"),
    [("cli", signal.SIGINT), ("script", signal.SIGTERM)],
    ids=["millstream-run-ctrl-c", "run_local-sigterm"],
)
def test_a_signal_stops_every_worker_and_a_rerun_resumes(
    tmp_path: Path, how: str, signum: signal.Signals
) -> None:
    expected = write_data(tmp_path, rows=8_000)
    (tmp_path / "job.py").write_text(JOB)
    store = f"sqlite:///{tmp_path / 'state.db'}"
    marker = f"MILLSTREAM_TEST_RUN={uuid.uuid4().hex}"
    env = {
        **os.environ,
        "JOB_STORE": store,
        "JOB_MAP_SLEEP": "0.1",
        marker.split("=")[0]: marker.split("=")[1],
    }
    command = (
        [sys.executable, "-m", "millstream", "run", "job.py:processor"]
        if how == "cli"
        else [sys.executable, "job.py"]
    )
    run = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Stop it half-way: once reducers have committed something.
        while not (tmp_path / "state.db").exists() or not sums_in(store):
            assert run.poll() is None, run.communicate()
            time.sleep(0.1)
        if signum == signal.SIGINT:
            os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        else:
            os.kill(run.pid, signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, err
    assert "millstream: stopped:" in err, err
    assert "Traceback" not in err or how == "script"
    if how == "cli":
        assert run.returncode == 128 + signum
        assert "stopped:" in out
    left = _processes_with(marker)
    for _ in range(50):  # the fork server notices its runner's exit on its own
        if not left:
            break
        time.sleep(0.1)
        left = _processes_with(marker)
    assert left == [], f"processes left behind: {left}"
    partial = sums_in(store)
    assert partial != expected  # stopped before the end

    env["JOB_MAP_SLEEP"] = "0"
    again = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert again.returncode == 0, again.stderr
    assert "drained: 8,000 rows read" in again.stdout
    assert sums_in(store) == expected
