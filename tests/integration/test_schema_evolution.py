"""Schema evolution through real runs: random sequences of safe and unsafe schema changes
over ParquetLog files and store queue appends.

Every safe sequence gives exact results (the mappers' windows widen as the rows do, and a
run interrupted and resumed from the persisted state agrees with one that was not); every
unsafe change is an error naming the file or the append, the column and both types, and
nothing of the failing step is committed. The runs are the real workers stepped in one
process (:func:`millstream.testing.run_in_process`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import millstream as ms
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from millstream.exceptions import InputError
from millstream.inputs import StoreQueue
from millstream.testing import run_in_process

from tests.support.jobs import PassThroughMapper, read_output
from tests.support.schema_jobs import EvolvingSumReducer, Step, expected_output, partition_steps

TUNING = ms.Tuning(batch_rows=8)
"""Batches smaller than most steps: a step's rows reach the window in several."""

OUTPUTS = ("sum", "rows", "extra", "tag")


def _processor(source: Any, store: str) -> ms.Processor:
    return ms.Processor(
        mapper=PassThroughMapper,
        reducer=EvolvingSumReducer,
        input=source,
        store=store,
        num_reducers=2,
        tuning=TUNING,
    )


def _run(processor: ms.Processor, interrupt: int | None) -> None:
    """Run to the end; with ``interrupt``, stop after that many rounds first and run again
    from the persisted state (new workers: a restart)."""
    if interrupt is not None:
        try:
            run_in_process(processor, max_rounds=interrupt)
            return
        except RuntimeError:
            pass  # not drained yet
    run_in_process(processor)


def _outputs(processor: ms.Processor) -> dict[str, dict[Any, int]]:
    return {name: {k: n for k, n in read_output(processor, name).items() if n} for name in OUTPUTS}


def _names_the_change(message: str, step: Step) -> None:
    assert f"column {step.column!r} changed from {step.before} to {step.after}" in message


def _draw_partitions(data: Any, *, dictionaries: bool) -> list[list[Step]]:
    unsafe_partition = data.draw(st.sampled_from([None, None, 0, 1]), label="unsafe partition")
    partitions = [
        data.draw(
            partition_steps(p, dictionaries=dictionaries, unsafe=p == unsafe_partition),
            label=f"partition {p}",
        )
        for p in range(2)
    ]
    kinds = {s.unsafe for steps in partitions for s in steps} - {""}
    event(f"unsafe change: {kinds.pop() if kinds else 'none'}")
    return partitions


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_parquet_log_schema_sequences(tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    partitions = _draw_partitions(data, dictionaries=True)
    interrupt = data.draw(st.none() | st.integers(1, 8), label="interrupt after rounds")
    root = tmp_path_factory.mktemp("evolving")
    files: dict[int, Path] = {}
    for p, steps in enumerate(partitions):
        (root / "in" / f"p{p}").mkdir(parents=True)
        for k, step in enumerate(steps):
            files[id(step)] = root / "in" / f"p{p}" / f"f{k:03d}.parquet"
            pq.write_table(pa.Table.from_batches([step.batch()]), files[id(step)])
    processor = _processor(ms.inputs.ParquetLog(str(root / "in")), f"sqlite:///{root}/state.db")
    bad = [(p, k) for p, steps in enumerate(partitions) for k, s in enumerate(steps) if s.unsafe]
    if not bad:
        _run(processor, interrupt)
        assert _outputs(processor) == expected_output([s for steps in partitions for s in steps])
        return
    p, k = bad[0]
    step = partitions[p][k]
    with pytest.raises(InputError) as caught:
        _run(processor, interrupt)
    message = str(caught.value)
    assert str(files[id(step)]) in message
    _names_the_change(message, step)
    committed = set(_outputs(processor)["rows"])
    assert committed.isdisjoint(key for s in partitions[p][k:] for key in s.keys)


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_store_queue_schema_sequences(tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    partitions = _draw_partitions(data, dictionaries=False)
    interrupt = data.draw(st.none() | st.integers(1, 8), label="interrupt after rounds")
    url = f"sqlite:///{tmp_path_factory.mktemp('evolving')}/state.db"
    queue = StoreQueue(url, "events", 2)
    accepted = []
    try:
        for p, steps in enumerate(partitions):
            for sequence, step in enumerate(steps):
                end = queue.end_row_index(p)
                if not step.unsafe:
                    queue.append_as(p, step.batch(), f"producer-{p}", sequence)
                    accepted.append(step)
                    continue
                with pytest.raises(InputError) as caught:
                    queue.append_as(p, step.batch(), f"producer-{p}", sequence)
                message = str(caught.value)
                assert f"queue 'events' partition {p}" in message
                assert f"producer 'producer-{p}' sequence {sequence} at row {end}" in message
                _names_the_change(message, step)
                assert queue.end_row_index(p) == end, "nothing of a refused append lands"
            queue.close_partition(p)
        processor = _processor(queue, url)
        _run(processor, interrupt)
        assert _outputs(processor) == expected_output(accepted)
    finally:
        queue.close()
