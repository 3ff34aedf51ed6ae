"""What holds while a part is cut off, counted in committed rows (no timings).

Hosts: mapper 0 on host 0, mapper 1 on host 1, reducer 0 on host 2, reducer 1 on host 3
(and, for split brain, a second instance of reducer 0 on host 4). A reducer's committed
index of a mapper is that mapper's shuffle numbering, shared by every reducer: how far
each reducer got in each mapper's stream during a cut shows who kept working.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import millstream as ms
import pytest
from millstream.ledger import read_statuses

from tests.support.hosts.cluster import Cluster
from tests.support.hosts.hosted import (
    GatedKeyedSumMapper,
    Layout,
    committed,
    drain,
    hosted_runner,
    run_until,
    with_tls,
)
from tests.support.jobs import (
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)

pytestmark = pytest.mark.usefixtures("root")

ROWS = 400_000
PROGRESS = 10_000
"""Rows of a mapper's stream the uncut parts commit while the cut lasts."""


def _processor(directory: Path) -> tuple[ms.Processor, Path, Path]:
    data = write_keyed_input(directory / "in", ROWS, partitions=2, file_rows=50_000)
    gate = directory / "gate"
    gate.touch()
    tune = with_tls(tuning(batch_rows=1_000), directory / "tls")
    processor = keyed_processor(
        data,
        directory / "state.db",
        tune=tune,
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": 0.1},
    )
    return processor, data, gate


def test_a_reducer_cut_from_one_mapper_and_that_mapper_keep_serving_the_rest(
    tmp_path: Path,
) -> None:
    processor, data, gate = _processor(tmp_path)
    layout = Layout(num_mappers=2, num_reducers=2)
    with Cluster(layout.size) as cluster:
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        try:
            run_until(runner, lambda: min(map(min, committed(processor))) >= 0, "started")
            cluster.cut(2, [0])  # reducer 0's host from mapper 0's host only
            before = committed(processor)

            def progress() -> list[list[int]]:
                now = committed(processor)
                return [
                    [n - b for n, b in zip(*rb, strict=True)]
                    for rb in zip(now, before, strict=True)
                ]

            run_until(
                runner,
                lambda: progress()[0][1] >= PROGRESS and progress()[1][0] >= PROGRESS,
                f"{PROGRESS} rows of the uncut pairs committed during the cut",
            )
            during = progress()
            print(f"committed during the cut, per reducer and mapper: {during}")
            cluster.heal()
            gate.unlink()
            summary = drain(runner)
        except BaseException:
            runner.stop()
            raise
    # Reducer 0 kept committing mapper 1's rows; mapper 0 kept serving reducer 1; reducer 0
    # got none of mapper 0's rows beyond what was under way when the cut came.
    assert during[0][1] >= PROGRESS
    assert during[1][0] >= PROGRESS
    assert during[0][0] < during[1][0]
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == ROWS


def test_a_split_brain_pair_on_either_side_of_a_cut_never_both_commit(tmp_path: Path) -> None:
    processor, data, gate = _processor(tmp_path)
    layout = Layout(num_mappers=2, num_reducers=2, duplicates=(("reducer", 0),))
    with Cluster(layout.size) as cluster:
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        try:
            run_until(runner, lambda: min(map(min, committed(processor))) >= 0, "started")
            # Reducer 0's instances on hosts 2 and 4, each with one mapper: both live, both
            # reach the store, each gets the rows of its own side only.
            cluster.partition([0, 2])
            pids = runner.pids()
            assert ("reducer", 0, 0) in pids
            assert ("reducer", 0, 1) in pids
            before = committed(processor)[0]
            run_until(
                runner,
                lambda: all(
                    n - b >= PROGRESS for n, b in zip(committed(processor)[0], before, strict=True)
                ),
                f"{PROGRESS} rows of each mapper committed by reducer 0 during the cut",
            )
            still = runner.pids()
            cluster.heal()
            gate.unlink()
            summary = drain(runner)
        except BaseException:
            runner.stop()
            raise
    # Each side committed its own mapper's rows for reducer 0, never the other's twice: the
    # sums are exact (a batch committed by both instances would count twice).
    assert still[("reducer", 0, 0)] == pids[("reducer", 0, 0)]
    assert still[("reducer", 0, 1)] == pids[("reducer", 0, 1)]
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == ROWS


MEMORY_LIMIT = 400_000
"""A window a few dozen batches deep: a mapper cut from a reducer fills it within seconds."""


def read_statuses_now(processor: ms.Processor) -> dict[tuple[str, int], dict[str, Any]]:
    """Every worker's last published metrics (``millstream status`` reads the same)."""
    store = processor.open_store()
    try:
        return store.transact(read_statuses)
    finally:
        store.close()


def test_a_mapper_cut_from_a_reducer_stays_within_its_memory_limit(tmp_path: Path) -> None:
    """While reducer 0 is cut from mapper 0, the rows mapper 0 holds for it fill the
    window up to its limit and no further; straggler spill then lets mapper 0 read on and
    serve reducer 1, and reducer 0 reads the spilled rows after the heal: exact sums."""
    processor, data, gate = _processor(tmp_path)
    processor = dataclasses.replace(
        processor,
        tuning=dataclasses.replace(
            processor.tuning, memory_limit_bytes=MEMORY_LIMIT, spill_after_seconds=1.0
        ),
    )
    layout = Layout(num_mappers=2, num_reducers=2)
    held: list[int] = []

    def window_bytes() -> int:
        status = read_statuses_now(processor).get(("mapper", 0), {})
        assert status.get("memory_limit_bytes") in (None, MEMORY_LIMIT)
        held.append(int(status.get("window_bytes", 0)))
        return held[-1]

    with Cluster(layout.size) as cluster:
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        try:
            run_until(runner, lambda: min(map(min, committed(processor))) >= 0, "started")
            cluster.cut(2, [0])
            before = committed(processor)
            run_until(
                runner,
                lambda: (
                    window_bytes() >= MEMORY_LIMIT // 2
                    and committed(processor)[1][0] - before[1][0] >= PROGRESS
                ),
                f"mapper 0's window half full and {PROGRESS} of its rows committed by "
                "reducer 1 during the cut",
            )
            cluster.heal()
            gate.unlink()
            summary = drain(runner)
        except BaseException:
            runner.stop()
            raise
    print(f"mapper 0's window during the cut: at most {max(held)} bytes of {MEMORY_LIMIT}")
    assert max(held) <= MEMORY_LIMIT
    assert read_output(processor, "sum") == expected_sums(data)
    assert summary.rows_read == ROWS
