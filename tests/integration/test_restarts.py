"""Crash loops end: failures no restart cures stop the run at once, naming the cause; a
worker that keeps dying stops the run after the restart strategy's bounded restarts; and
nothing that happens to a process the runner started (its fork server included) kills the
runner itself."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.exceptions import ConfigurationError, CrashLoopError
from millstream.runner.forkserver import die_with_parent, fork_server_pid, start_fork_server
from millstream.runner.local import LocalRunner

from tests.support.jobs import (
    KeyedSumMapper,
    expected_sums,
    keyed_processor,
    read_output,
    write_keyed_input,
)

FAILS_ON_IMPORT = """
import os

import millstream as ms
import pyarrow as pa

if os.environ.get("MILLSTREAM_TEST_IMPORTER") != str(os.getpid()):
    raise RuntimeError("this module refuses to import outside the test process")


class ImportFailsMapper(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.to_reducer(batch, 0)
"""


class StartFailsMapper(KeyedSumMapper):
    """A mapper whose constructor fails in every process, as a missing resource would."""

    def __init__(self, spec: ms.WorkerSpec, config: dict[str, object]) -> None:
        raise RuntimeError("the model file /nonexistent/model.bin is missing")

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:  # pragma: no cover
        raise AssertionError("never constructed")


def test_a_module_that_fails_to_import_in_the_worker_stops_the_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_keyed_input(tmp_path / "in", 4_000)
    (tmp_path / "fails_on_import.py").write_text(textwrap.dedent(FAILS_ON_IMPORT))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MILLSTREAM_TEST_IMPORTER", str(os.getpid()))
    module = importlib.import_module("fails_on_import")
    try:
        processor = keyed_processor(
            data, tmp_path / "state.db", mapper=module.ImportFailsMapper, name="imports"
        )
        runner = LocalRunner(processor)
        started = time.monotonic()
        # Without the fix the worker is restarted for ever: the timeout turns that into a
        # failure of this test instead of a hang.
        with pytest.raises(ConfigurationError) as raised:
            runner.run(timeout=90)
        print(f"stopped after {time.monotonic() - started:.2f} s")
    finally:
        sys.modules.pop("fails_on_import", None)
    message = str(raised.value)
    assert "could not load the processor's classes in the worker process" in message
    assert "RuntimeError: this module refuses to import outside the test process" in message
    assert runner.restarts == 0
    assert runner.pids() == {}


def test_a_worker_failing_at_every_start_ends_in_a_crash_loop_error(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 4_000)
    processor = keyed_processor(data, tmp_path / "state.db", mapper=StartFailsMapper)
    runner = LocalRunner(processor)
    started = time.monotonic()
    with pytest.raises(CrashLoopError) as raised:
        runner.run(timeout=90)
    print(f"stopped after {time.monotonic() - started:.2f} s")
    message = str(raised.value)
    assert "RuntimeError: the model file /nonexistent/model.bin is missing" in message
    assert "more than the 10 restarts" in message
    assert "mapper" in message
    assert runner.pids() == {}


def test_restart_strategy_bounds_the_restarts(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 4_000)
    tune = ms.Tuning(restart=ms.RestartStrategy(max_restarts=2, backoff_seconds=0.01))
    processor = keyed_processor(data, tmp_path / "state.db", mapper=StartFailsMapper, tune=tune)
    runner = LocalRunner(processor)
    with pytest.raises(CrashLoopError, match="more than the 2 restarts"):
        runner.run(timeout=90)
    # Both mappers fail; the first to exceed its budget was restarted exactly twice.
    assert 2 <= runner.restarts <= 4


def test_a_fork_server_killed_while_starting_a_worker_does_not_kill_the_runner(
    tmp_path: Path,
) -> None:
    data = write_keyed_input(tmp_path / "in", 20_000)
    processor = keyed_processor(data, tmp_path / "state.db")
    start_fork_server(processor)
    pid = fork_server_pid()
    assert pid is not None
    # A stopped server accepts the start request and never answers; killing it then makes
    # the start fail half-way, as a SIGKILL at the wrong moment does.
    os.kill(pid, signal.SIGSTOP)
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        summary = LocalRunner(processor).run(timeout=120)
    finally:
        killer.join()
    assert fork_server_pid() != pid
    assert summary.rows_read == 20_000
    assert read_output(processor, "sum") == expected_sums(data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux parent-death signal")
def test_a_worker_whose_fork_server_died_before_it_asked_to_die_with_it_ends_at_once() -> None:
    # The fork server's process id, as the runner passes it, against the child's parent:
    # a child whose expected parent is gone (here: never was its parent) kills itself, so
    # no orphan outlives its fork server unseen; a child of the expected parent lives on.
    ctx = multiprocessing.get_context("fork")
    orphan = ctx.Process(target=die_with_parent, args=(os.getpid() + 1_000_000,))
    orphan.start()
    orphan.join(10)
    assert orphan.exitcode == -signal.SIGKILL
    child = ctx.Process(target=die_with_parent, args=(os.getpid(),))
    child.start()
    child.join(10)
    assert child.exitcode == 0
