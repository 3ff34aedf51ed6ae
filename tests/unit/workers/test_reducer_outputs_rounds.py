"""Reducer rounds whose outputs are files: a queue reducer's round that writes only a
file commits it, and the files of a commit reported unknown are published on the next
rounds once the store shows that it landed, never when it did not (issue 42)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
from millstream.exceptions import CommitUnknownResultError
from millstream.outputs import STAGING, ParquetSink
from millstream.testing import MemoryInput, run_in_process

from tests.support.output_rounds import PlannedOutputs, Rig
from tests.support.worker_fixtures import PassThrough, tables


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="millstream")


class SummaryFiles(ms.QueueReducer):
    """Its only output is a Parquet sink: every ``process`` publishes a one-row file (a
    token, the rows pending, whether it finished them); rows are finished only once
    every mapper ended, so the rounds before write a file and nothing else."""

    emitted: list[str] = []  # noqa: RUF012 (shared on purpose)

    def process(self, pending: ms.PendingRows, txn: ms.Transaction) -> None:
        everyone = len(pending.ended_partitions) == self.spec.num_partitions
        if everyone:
            pending.finish_all()
        token = uuid.uuid4().hex
        summary = {"token": [token], "pending": [len(pending)], "finished": [everyone]}
        txn.write_parquet(self.config["sink"], pa.table(summary))
        SummaryFiles.emitted.append(token)


def test_a_queue_reducer_whose_only_output_is_a_sink_publishes_every_round(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    out = tmp_path / "out"
    sink = ParquetSink(url, "summaries", str(out))
    data = tables(2)
    processor = ms.Processor(
        mapper=PassThrough,
        reducer=SummaryFiles,
        input=MemoryInput(data),
        store=url,
        num_reducers=2,
        config={"sink": sink},
        outputs=[sink],
        tuning=ms.Tuning(batch_rows=100),
    )
    SummaryFiles.emitted = []
    run_in_process(processor)
    plain = pads.dataset(str(out), format="parquet").to_table()
    published = plain["token"].to_pylist()
    assert len(SummaryFiles.emitted) > 2, "rounds before the end of input wrote files"
    assert sorted(published) == sorted(SummaryFiles.emitted), "every round's file, once"
    finished = plain.filter(plain["finished"])
    assert pc.sum(finished["pending"]).as_py() == sum(t.num_rows for t in data)
    assert not list((out / STAGING).iterdir())


@pytest.mark.parametrize("fault", ["unknown", "unknown_late", "unknown_unapplied"])
def test_a_file_of_a_commit_reported_unknown_is_published_before_the_drain_if_it_landed(
    tmp_path: Path, fault: str
) -> None:
    r = Rig(tmp_path, tables(2), PlannedOutputs)
    try:
        PlannedOutputs.emitted = []
        PlannedOutputs.plan = (frozenset({"parquet"}), True)
        r.ingest()
        r.plan.armed.append(fault)
        with pytest.raises(CommitUnknownResultError):
            r.reducer.run_once()
        [(token, _, _)] = PlannedOutputs.emitted
        assert token not in r.published()
        PlannedOutputs.plan = (frozenset(), True)  # later rounds commit rows, no file
        for _ in range(3):
            r.ingest()
            r.reducer.run_once()
            r.trim()
        assert not r.drained(), "still before the drain"
        landed = fault != "unknown_unapplied"
        assert r.published().count(token) == landed
        assert r.staged() == [], "landed: published; never landed: deleted"
        r.run_to_end()
        assert r.reducer.finish()
        assert r.published().count(token) == landed
        assert len(r.sink.recorded()) == landed, "the only file written: recorded if landed"
        assert r.stored("rows") == {0: (2_000).to_bytes(8, "little", signed=True)}
    finally:
        r.close()
