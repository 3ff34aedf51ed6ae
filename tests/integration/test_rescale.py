"""Rescaling reducers: the keyed sum started with 2 reducers is rescaled to 3, then to 1,
mid-stream, every run under kill -9: the sums are exact, every row after a rescale
reaches the owner of its key group, and a rescale killed half-way finishes when run
again. The same for an event-time aggregation whose open panes' partials are stored."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import millstream as ms
import pytest
from millstream.exceptions import ConfigurationError
from millstream.ledger import (
    ProcessorInfo,
    RescalePlan,
    read_processor_info,
    read_rescale,
    summarize,
)
from millstream.outputs import ParquetSink
from millstream.runner.local import LocalRunner

from tests.support.chaos import RandomKiller
from tests.support.jobs import (
    EVENT_DISORDER_MS,
    EVENT_PANES,
    KeyGroupSumReducer,
    SlowKeyedSumMapper,
    SlowPaneMapper,
    expected_panes,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_event_input,
    write_keyed_input,
    written_panes,
)
from tests.support.stores import ON_BOTH

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ROWS = 60_000
PANE_ROWS = 120_000

JOB = """
import os
from pathlib import Path

from tests.support.jobs import KeyGroupSumReducer, SlowKeyedSumMapper, keyed_processor, tuning

processor = keyed_processor(
    Path(os.environ["MILLSTREAM_TEST_DATA"]),
    os.environ["MILLSTREAM_TEST_STATE"],
    num_reducers=int(os.environ["MILLSTREAM_TEST_REDUCERS"]),
    mapper=SlowKeyedSumMapper,
    reducer=KeyGroupSumReducer,
    config={"map_seconds": float(os.environ["MILLSTREAM_TEST_MAP_SECONDS"])},
    tune=tuning(batch_rows=500),
    name="rescaled",
)
"""


def _processor(data: Path, state: Path | str, reducers: int) -> ms.Processor:
    return keyed_processor(
        data,
        state,
        num_reducers=reducers,
        mapper=SlowKeyedSumMapper,
        reducer=KeyGroupSumReducer,
        config={"map_seconds": 0.05},
        tune=tuning(batch_rows=500),
        name="rescaled",
    )


def _rows_reduced(processor: ms.Processor) -> int:
    """Input rows whose effects are committed and persisted."""
    store = processor.open_store()
    try:
        return summarize(store, processor.info, 0, 0.0).rows_read
    finally:
        store.close()


def _run_under_chaos_until(processor: ms.Processor, rows_read: int, seed: int) -> None:
    """Run with random kill -9 until ``rows_read`` input rows are persisted; then stop."""
    runner = LocalRunner(processor)
    runner.start()
    try:
        with RandomKiller(runner, seed=seed, max_kills=6) as killer:
            deadline = time.monotonic() + 120
            while _rows_reduced(processor) < rows_read:
                assert not runner.poll(), "drained before it could be stopped mid-stream"
                assert time.monotonic() < deadline, "no progress within 120 s"
                time.sleep(0.05)
        print(
            f"{processor.num_reducers} reducers: stopped at {_rows_reduced(processor)} rows, "
            f"killed {killer.kills}"
        )
    finally:
        runner.stop()


def _stored(processor: ms.Processor) -> tuple[ProcessorInfo | None, RescalePlan | None]:
    """The processor's record and its unfinished rescale, as stored."""
    store = processor.open_store()
    try:
        with store.read() as txn:
            return read_processor_info(txn), read_rescale(txn)
    finally:
        store.close()


def _cli_rescale(
    data: Path, state: Path | str, reducers: int, map_seconds: float
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MILLSTREAM_TEST_DATA": str(data),
        "MILLSTREAM_TEST_STATE": str(state),
        "MILLSTREAM_TEST_REDUCERS": str(reducers),
        "MILLSTREAM_TEST_MAP_SECONDS": str(map_seconds),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "millstream",
            "rescale",
            "rescale_job.py:processor",
            "--reducers",
            str(reducers),
        ],
        cwd=data.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.parametrize("state_url", ON_BOTH, indirect=True)
def test_rescaling_2_to_3_to_1_reducers_mid_stream_under_kill_9_is_exact(
    tmp_path: Path, state_url: str
) -> None:
    data = write_keyed_input(tmp_path / "in", ROWS, partitions=4, file_rows=1_000)
    state = state_url
    (tmp_path / "rescale_job.py").write_text(JOB)
    two = _processor(data, state, 2)
    _run_under_chaos_until(two, 12_000, seed=5)

    three = _processor(data, state, 3)
    with pytest.raises(ConfigurationError, match="millstream rescale"):
        LocalRunner(three).run(timeout=60)
    summary = ms.rescale(three)
    print(summary)
    assert (summary.old_reducers, summary.new_reducers) == (2, 3)
    info, _ = _stored(three)
    assert info is not None
    assert info.num_reducers == 3
    _run_under_chaos_until(three, 30_000, seed=7)

    # To 1 through the command line, killed half-way (kill -9 of its process group) and
    # run again: the second run finishes the first one's rescale.
    one = _processor(data, state, 1)
    first = _cli_rescale(data, state, 1, map_seconds=2.0)
    while _stored(one)[1] is None:  # until it recorded its cut
        assert first.poll() is None, first.communicate()
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    _, plan = _stored(one)
    print(f"rescale killed with plan {plan}")
    assert plan is not None  # killed before it finished
    assert plan.num_reducers == 1
    for _ in range(20):  # until the killed run's workers are seen dead
        again = _cli_rescale(data, state, 1, map_seconds=0.05)
        out, err = again.communicate(timeout=180)
        if again.returncode == 0 or "workers of this processor are running" not in err:
            break
        time.sleep(1.0)
    assert again.returncode == 0, err
    print(out, err[-2_000:])

    runner = LocalRunner(one)
    with RandomKiller(runner, seed=11, max_kills=6) as killer:
        final = runner.run(timeout=240)
    print(f"1 reducer: {final}, killed {killer.kills}")
    assert final.rows_read == ROWS
    assert read_output(one, "sum") == expected_sums(data)
    assert read_output(one, "misrouted") == {}


class _KeepsRowsPending(ms.QueueReducer):
    """A queue reducer that does not say how to store its pending rows."""

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        pending.finish_all()


def test_a_rescale_refuses_queue_reducers_that_cannot_hand_over(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 2_000, partitions=2)
    processor = keyed_processor(data, tmp_path / "state.db", reducer=_KeepsRowsPending)
    with pytest.raises(ConfigurationError, match=r"does not override QueueReducer\.hand_over"):
        ms.rescale(processor)


def test_a_rescale_refuses_more_reducers_than_key_groups(tmp_path: Path) -> None:
    data = write_keyed_input(tmp_path / "in", 2_000, partitions=2)
    processor = dataclasses.replace(
        keyed_processor(data, tmp_path / "state.db", num_reducers=2), key_groups=4
    )
    processor.validate()
    ms.run_local(processor)
    with pytest.raises(ConfigurationError, match="key_groups"):
        dataclasses.replace(processor, num_reducers=5)


def _pane_processor(
    data: Path, state: Path, sink: ParquetSink, reducers: int, reducer: type[ms.Reducer]
) -> ms.Processor:
    return ms.Processor(
        mapper=SlowPaneMapper,
        reducer=reducer,
        input=ms.inputs.ParquetLog(str(data)),
        store=f"sqlite:///{state}",
        name="panes",
        num_reducers=reducers,
        config={"panes": EVENT_PANES, "map_seconds": 0.08},
        outputs=[sink],
        tuning=tuning(batch_rows=500, commit_interval_seconds=0.1),
    )


@pytest.mark.parametrize(
    "reducer",
    [ms.event_time.PaneReducer, ms.event_time.PendingPaneReducer],
    ids=["stored", "pending"],
)
def test_rescaling_a_pane_aggregation_2_to_3_to_1_under_kill_9_is_exact(
    tmp_path: Path, reducer: type[ms.Reducer]
) -> None:
    """Tumbling minutes per key, open panes' partials stored (or pending in the mappers,
    stored by key group at each rescale): every pane is emitted once, with every row,
    though its key group changed owner twice while it was open."""
    data = write_event_input(tmp_path / "in", PANE_ROWS, disorder_ms=EVENT_DISORDER_MS)
    state = tmp_path / "state.db"
    sink = ParquetSink(f"sqlite:///{state}", "per-minute", str(tmp_path / "out"))
    _run_under_chaos_until(_pane_processor(data, state, sink, 2, reducer), PANE_ROWS // 5, seed=3)

    summary = ms.rescale(_pane_processor(data, state, sink, 3, reducer))
    print(summary)
    assert (summary.old_reducers, summary.new_reducers) == (2, 3)
    _run_under_chaos_until(
        _pane_processor(data, state, sink, 3, reducer), 3 * PANE_ROWS // 5, seed=4
    )

    print(ms.rescale(_pane_processor(data, state, sink, 1, reducer)))
    one = _pane_processor(data, state, sink, 1, reducer)
    runner = LocalRunner(one)
    runner.start()
    with RandomKiller(runner, seed=5, max_kills=6) as killer:
        runner.wait(timeout=300)
    print(f"1 reducer: killed {killer.kills}")
    assert _rows_reduced(one) == PANE_ROWS
    assert ms.event_time.late_rows(one) == 0
    assert written_panes(sink) == expected_panes(data)
