"""The Spark start floor's job function (:mod:`bench.spark_floor`), run without Spark."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from bench.process_clock import process_started
from bench.spark_floor import commit_one
from bench.tests.test_process_clock import TICK


def test_each_partition_commits_its_row_and_reports_its_clocks_in_order(tmp_path: Path) -> None:
    database = str(tmp_path / "floor.db")
    before = time.time()
    reports = [report for p in range(3) for report in commit_one(database)(p, iter(()))]
    after = time.time()
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT partition, t FROM floor ORDER BY partition").fetchall()
    assert [p for p, _ in rows] == [0, 1, 2]
    assert [t for _, t in rows] == [r["entered"] for r in reports]
    for report in reports:
        assert before <= report["entered"] <= report["committed"] <= after
        assert abs(report["forked"] - process_started()) <= TICK
        assert report["parent"] <= report["forked"] + TICK
        assert report["cpu"] > 0
        assert report["parent_cpu"] >= 0


def test_the_commit_is_durable_in_wal_mode(tmp_path: Path) -> None:
    database = str(tmp_path / "floor.db")
    list(commit_one(database)(0, iter(())))
    with sqlite3.connect(database) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
