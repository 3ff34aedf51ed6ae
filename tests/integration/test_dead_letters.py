"""Dead letters in whole runs: under kill -9 of random workers with 1 % poison rows (half
raising in ``map``, half in ``reduce`` or a queue reducer's ``process``), every good row's
effect is committed once and every poison row is in the dead-letter queue once;
``millstream status``, the metrics and ``millstream dead-letters`` show them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import millstream as ms
import pytest
from millstream.cli import collect_status, main, render_status
from millstream.ledger.dead_letters import dead_letter_counts, read_dead_letters
from millstream.runner.local import LocalRunner

from tests.support.chaos import run_killed
from tests.support.dead_letter_jobs import (
    MAP_POISON,
    REDUCE_POISON,
    PoisonedQueueSum,
    PoisonedSum,
    SlowPoisonedPassThrough,
    good_sums,
    poison_values,
)
from tests.support.jobs import input_table, keyed_processor, read_output, tuning, write_keyed_input
from tests.support.metrics import scrape, total

ROWS = 60_000


def dead_letter_processor(
    tmp_path: Path, reducer: type[ms.Reducer] = PoisonedSum, **changes: object
) -> ms.Processor:
    data = write_keyed_input(tmp_path / "in", ROWS, partitions=2, unique_values=True)
    return keyed_processor(
        data,
        tmp_path / "state.db",
        mapper=SlowPoisonedPassThrough,
        reducer=reducer,
        tune=tuning(on_user_error="dead_letter", dead_letter_max_rows=None, **changes),
        config={"map_seconds": 0.04},
    )


def check_exactly_once(processor: ms.Processor, data: Path) -> None:
    """Good rows' sums exact; each poison row one record, counted once."""
    table = input_table(data)
    assert read_output(processor, "sum") == good_sums(table)
    with processor.open_store() as store, store.read() as txn:
        letters = read_dead_letters(txn)
        counts = dead_letter_counts(txn)
    for stage, residue in (("map", MAP_POISON), ("reduce", REDUCE_POISON)):
        values = [d.row["value"][0].as_py() for d in letters if d.stage == stage]
        assert sorted(values) == poison_values(table, residue), f"{stage}: lost or doubled"
        assert sum(n for (s, _), n in counts.items() if s == stage) == len(values)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "reducer"),
    [(46, PoisonedSum), (4602, PoisonedSum), (4603, PoisonedQueueSum)],
    ids=["reduce-46", "reduce-4602", "process-4603"],
)
def test_kill_9_with_poison_rows_commits_good_rows_once_and_poison_rows_once(
    tmp_path: Path, seed: int, reducer: type[ms.Reducer]
) -> None:
    processor = dead_letter_processor(
        tmp_path,
        reducer,
        batch_rows=2_000,
        memory_limit_bytes=200_000,
        commit_interval_seconds=0.1,
        restart=ms.RestartStrategy(max_restarts=1_000),
    )
    summary, kills = run_killed(processor, seed)
    assert summary.restarts > 0
    assert summary.rows_read == ROWS
    check_exactly_once(processor, tmp_path / "in")
    print(f"seed {seed}: killed {kills}")


def test_status_metrics_and_the_command_show_the_dead_letters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    processor = dead_letter_processor(tmp_path, batch_rows=5_000)
    runner = LocalRunner(processor, metrics_port=0)
    runner.start()
    try:
        assert runner.metrics is not None
        deadline = time.monotonic() + 240
        while not runner.poll():
            assert time.monotonic() < deadline, "the run did not drain within 240 s"
            time.sleep(0.2)
        final = scrape(runner.metrics.port)
    finally:
        runner.stop()
    check_exactly_once(processor, tmp_path / "in")
    table = input_table(tmp_path / "in")
    mapped = len(poison_values(table, MAP_POISON))
    reduced = len(poison_values(table, REDUCE_POISON))

    # Mappers count the rows of every batch they bisected (a replay would count again);
    # reducers the dead letters their commits wrote.
    assert total(final, "millstream_dead_letters_total", role="mapper") >= mapped
    assert total(final, "millstream_dead_letters_total", role="reducer") == reduced

    status = collect_status(processor.store, processor.name)
    assert status is not None
    assert status["dead_letters"] == mapped + reduced
    assert sum(m["dead_letters"] for m in status["mappers"]) == mapped
    assert sum(r["dead_letters"] for r in status["reducers"]) == reduced
    assert f"{mapped + reduced:,} dead letters (map: {mapped:,}" in render_status(status)

    assert main(["dead-letters", processor.store, "--prefix", processor.name, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == mapped + reduced
    assert {r["stage"] for r in records} == {"map", "reduce"}
    first = records[0]
    assert first["row"]["value"] == first["partition"] * (ROWS // 2) + first["index"]
    assert "map cannot take value" in first["error"]

    args = ["dead-letters", processor.store, "--prefix", processor.name, "--stage", "reduce"]
    assert main([*args, "--limit", "2"]) == 0
    shown = capsys.readouterr()
    assert shown.out.count("reduce partition") == 2
    assert "reduce cannot take value" in shown.out
    assert "2 dead letters" in shown.err
    assert main(["dead-letters", processor.store, "--prefix", "nobody"]) == 1
    assert main([*args, "--limit", "-1"]) == 2
    assert "--limit must be 0 (all) or more" in capsys.readouterr().err
