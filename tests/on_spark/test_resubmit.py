"""Which failed jobs the Spark runner submits again, and when it gives up (no session)."""

from __future__ import annotations

from typing import Any

import millstream as ms
import pytest
from millstream.exceptions import (
    ConfigurationError,
    CrashLoopError,
    InputError,
    MillstreamError,
    TransactionTooLargeError,
    UserCodeError,
)
from millstream.spark.launch import _failed_again, _translate

from examples.keyed_sum import PreAggregate, SumIntoStore

LOST = (
    "An error occurred while calling o87.collectToPython.\\n: org.apache.spark.SparkException: "
    "Job aborted due to stage failure: Task 0 in stage 3.0 failed 3 times, most recent "
    "failure: Lost task 0.2 in stage 3.0 (TID 9) (127.0.0.2 executor 1): "
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"
)


def worker_raised(kind: str, message: str) -> str:
    return (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        f'  File "worker.py", line 1, in run\nmillstream.exceptions.{kind}: {message}\n'
    )


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (worker_raised("UserCodeError", "map raised on rows 0..10"), UserCodeError),
        (worker_raised("ConfigurationError", "counts differ"), ConfigurationError),
        (worker_raised("InputError", "corrupt file"), InputError),
        (worker_raised("TransactionTooLargeError", "12 MB > 10 MB"), TransactionTooLargeError),
    ],
)
def test_errors_no_restart_cures_end_the_run(text: str, kind: type[Exception]) -> None:
    error, curable = _translate(Exception(text), "g")
    assert type(error) is kind
    assert not curable


def test_cancelling_ends_the_run() -> None:
    error, curable = _translate(Exception("Job 3 cancelled part of cancelled job group g"), "g")
    assert "cancelled" in str(error)
    assert not curable


def test_lost_tasks_are_submitted_again() -> None:
    error, curable = _translate(Exception(LOST), "g")
    assert type(error) is MillstreamError
    assert curable
    assert "failed 3 times" in str(error)


class _OnePartition:
    """An input that is never read: no worker starts here."""

    num_partitions = 1

    def reader(self, partition: int) -> Any:
        raise AssertionError("not read")


def test_too_many_failed_jobs_within_the_window_is_a_crash_loop() -> None:
    processor = ms.Processor(
        mapper=PreAggregate,
        reducer=SumIntoStore,
        input=_OnePartition(),
        store="sqlite:///tmp/millstream-resubmit-test.db",
        num_reducers=1,
        tuning=ms.Tuning(restart=ms.RestartStrategy(max_restarts=2, interval_seconds=60)),
    )
    failures: list[float] = []
    failures = _failed_again(processor, failures, MillstreamError("lost"))
    failures = _failed_again(processor, failures, MillstreamError("lost"))
    with pytest.raises(CrashLoopError, match=r"failed 3 times within 60 s.*max_restarts"):
        _failed_again(processor, failures, MillstreamError("lost"))
    assert len(_failed_again(processor, [-1e9, -1e9], MillstreamError("lost"))) == 1
