"""Workers fork from a long-lived fork server, yet see the parent's current path and env."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest
from millstream.runner.local import LocalRunner

from tests.support.jobs import expected_sums, keyed_processor, read_output, write_keyed_input

MODULE = """
import os

import millstream as ms
import pyarrow as pa


class EnvCheckingMapper(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        if os.environ.get("MILLSTREAM_TEST_MARKER") != "{marker}":
            raise RuntimeError("the worker does not see the parent's environment")
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        sums = sums.rename_columns(["key", "value"])
        return ms.Partitioned.by_hash(sums, key="key", num_reducers=self.spec.num_reducers)
"""


def test_late_sys_path_and_environment_reach_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_keyed_input(tmp_path / "in", 8_000)
    # A first run starts the fork server (if no earlier test did).
    LocalRunner(keyed_processor(data, tmp_path / "first.db")).run(timeout=120)

    # Only now: a new import path, a module on it, and an environment variable.
    late = tmp_path / "late"
    late.mkdir()
    (late / "late_jobs.py").write_text(textwrap.dedent(MODULE.format(marker="present")))
    monkeypatch.syspath_prepend(str(late))
    monkeypatch.setenv("MILLSTREAM_TEST_MARKER", "present")
    late_jobs = importlib.import_module("late_jobs")
    try:
        processor = keyed_processor(
            data, tmp_path / "second.db", mapper=late_jobs.EnvCheckingMapper, name="late"
        )
        summary = LocalRunner(processor).run(timeout=120)
    finally:
        sys.modules.pop("late_jobs", None)
    assert summary.rows_read == 8_000
    assert read_output(processor, "sum") == expected_sums(data)
    assert os.environ["MILLSTREAM_TEST_MARKER"] == "present"
