"""FoundationDB's own faults, for real: its server killed mid-commit and restarted, and its
own limits (five seconds, 10 MB, 100 kB) met by the cluster rather than by millstream's
checks in front of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import millstream as ms
import pytest
from millstream.exceptions import (
    TransactionTooLargeError,
    TransactionTooOldError,
    ValueTooLargeError,
)
from millstream.ledger import summarize
from millstream.runner.local import LocalRunner
from millstream.state import Store, StoreLimits, open_store
from millstream.state.replay import ReplayingTransaction

from tests.support.fdb_cluster import FdbBinaries, FdbCluster, start_cluster
from tests.support.jobs import (
    SlowKeyedSumMapper,
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)

pytestmark = pytest.mark.fdb

ROWS = 60_000
NO_LIMITS = StoreLimits(
    max_key_bytes=1_000_000,
    max_value_bytes=100_000_000,
    max_transaction_bytes=1_000_000_000,
    max_transaction_seconds=3600.0,
)
"""Limits millstream does not reach first, so that the cluster's own limits are met."""


@pytest.fixture
def own_cluster(fdb_binaries: FdbBinaries) -> Iterator[FdbCluster]:
    """A cluster of the test's own, which it may kill and restart."""
    cluster = start_cluster(fdb_binaries)
    try:
        yield cluster
    finally:
        cluster.stop()


def _rows_reduced(processor: ms.Processor) -> int:
    store = processor.open_store()
    try:
        return summarize(store, processor.info, 0, 0.0).rows_read
    finally:
        store.close()


def _wait_until_reduced(processor: ms.Processor, runner: LocalRunner, rows: int) -> int:
    deadline = time.monotonic() + 120
    while (done := _rows_reduced(processor)) < rows:
        assert not runner.poll(), "drained before the server could be killed mid-stream"
        assert time.monotonic() < deadline, "no progress within 120 s"
        time.sleep(0.05)
    return done


def test_killing_fdbserver_during_commits_keeps_a_keyed_sum_exact(
    tmp_path: Path, own_cluster: FdbCluster
) -> None:
    """kill -9 of the only ``fdbserver`` while mappers and reducers commit, twice: clients
    see their commits fail (unknown results, timeouts) and retry; the server recovers its
    data from disk when started again, and every sum is exact."""
    data = write_keyed_input(tmp_path / "in", ROWS, partitions=2, file_rows=2_000)
    processor = keyed_processor(
        data,
        f"{own_cluster.url}?timeout_ms=3000",
        num_reducers=2,
        mapper=SlowKeyedSumMapper,
        config={"map_seconds": 0.1},
        tune=tuning(
            batch_rows=1_000,
            commit_interval_seconds=0.05,
            restart=ms.RestartStrategy(max_restarts=1_000),
        ),
    )
    runner = LocalRunner(processor)
    runner.start()
    try:
        for fraction in (0.2, 0.5):
            done = _wait_until_reduced(processor, runner, int(ROWS * fraction))
            own_cluster.kill()
            print(f"fdbserver killed at {done} rows reduced")
            time.sleep(1.0)  # clients find it gone while they commit
            own_cluster.restart()
            # The memory engine logs every commit to disk: what was committed is there.
            assert _rows_reduced(processor) >= done
        summary = runner.wait(timeout=300)
    finally:
        runner.stop()
    assert summary.rows_read == ROWS
    assert read_output(processor, "sum") == expected_sums(data)
    print(f"restarts {summary.restarts}")


@pytest.fixture
def unlimited(fdb_url: str) -> Iterator[Store]:
    store = open_store(fdb_url, prefix=("fdb-faults", time.time_ns()), limits=NO_LIMITS)
    try:
        yield store
    finally:
        store.transact(lambda txn: txn.clear_range_startswith(()))
        store.close()


def _advance(store: Store) -> None:
    """Commit something: the cluster's versions move on with commits, and a read version
    becomes too old once the versions since pass five seconds' worth."""
    store.transact(lambda txn: txn.add(("clock",), 1))


def test_a_read_past_five_seconds_is_too_old_and_the_replaying_transaction_renews(
    unlimited: Store,
) -> None:
    """FoundationDB refuses a read at a version older than five seconds
    (``transaction_too_old``): a plain transaction fails with the advice; the reducer's
    replaying transaction starts a new one, replays what it read and wrote, and commits."""
    unlimited.transact(lambda txn: txn.set(("seen",), b"1"))
    plain = unlimited.create_transaction()
    plain.get(("seen",))
    time.sleep(6.0)
    _advance(unlimited)
    with pytest.raises(TransactionTooOldError, match="five seconds"):
        plain.get(("other",))
    plain.reset()

    replaying = ReplayingTransaction(unlimited, renew_after_seconds=3600.0)
    assert replaying.get(("seen",)) == b"1"
    replaying.set(("written",), b"before")
    time.sleep(6.0)  # the user's reduce computing
    _advance(unlimited)
    assert replaying.get(("other",)) is None
    replaying.set(("written",), b"after")
    replaying.commit()
    assert replaying.renewals == 1
    assert unlimited.transact(lambda txn: txn.get(("written",))) == b"after"


def test_the_clusters_own_size_limits_give_clear_errors(unlimited: Store) -> None:
    """Past millstream's checks, the cluster itself refuses a value over 100 kB and a
    transaction over 10 MB, and the errors say what to do."""
    with pytest.raises(ValueTooLargeError, match="split it over keys"):
        unlimited.transact(lambda txn: txn.set(("value",), b"x" * 100_001))

    def too_large(txn: ms.Transaction) -> None:
        for i in range(120):
            txn.set(("big", i), b"x" * 90_000)

    with pytest.raises(TransactionTooLargeError, match="commit more often"):
        unlimited.transact(too_large)
    assert unlimited.transact(lambda txn: txn.get_range_startswith(("big",))) == []
