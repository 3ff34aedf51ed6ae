"""A reducer's drain and start-up under store failures (issue 42, item 11): its loop
backs off and retries as after a failed round, and the drain commits exactly once, an
unknown outcome resolved by the drained marker it reads first."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pytest
from millstream.state import encode_int64

from tests.support.output_rounds import SINK, Rig
from tests.support.worker_fixtures import CountRows, expected_counts, tables


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="millstream")


class CountThenDrain(CountRows):
    """Counts rows per key; its drain adds 1 under ``("drains", 0)`` and publishes a
    one-row file. ``on_drain`` (set by the test) runs when ``drain`` is called."""

    on_drain: Callable[[], None] | None = None

    def drain(self, txn: ms.Transaction) -> None:
        if CountThenDrain.on_drain is not None:
            CountThenDrain.on_drain()
        txn.add(("drains", 0), 1)
        txn.write_parquet(SINK, pa.table({"token": [uuid.uuid4().hex]}))


def _drained_once(r: Rig) -> None:
    assert r.stored("drains") == {0: encode_int64(1)}, "drain committed exactly once"
    assert len(r.published()) == 1, "its file published once"
    assert r.staged() == []
    assert r.cluster.output() == expected_counts(r.cluster.tables)
    assert r.queue.is_sealed(0), "the last reducer to drain seals the output queue"


def _outage(r: Rig, calls: int) -> Callable[[], None]:
    """Take the store down now, for the next ``calls`` store calls (once)."""
    done = False

    def down() -> None:
        nonlocal done
        if not done:
            done = True
            r.plan.unavailable = True
            r.plan.stalls.append([calls, lambda: setattr(r.plan, "unavailable", False)])

    return down


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    CountThenDrain.on_drain = None
    r = Rig(tmp_path, tables(2), CountThenDrain)
    r.run_to_end()  # every row committed, every mapper drained; the drain is left
    return r


@pytest.mark.parametrize(
    "faults",
    [
        ("unavailable", "unavailable", "unavailable"),
        ("unknown",),
        ("unknown_unapplied",),
        ("unknown_late",),
        ("unavailable", "unknown", "conflict"),
    ],
)
def test_the_drain_commit_is_retried_after_store_failures_and_commits_once(
    rig: Rig, faults: tuple[str, ...]
) -> None:
    try:
        armed = False

        def arm() -> None:  # the next commits are the drain's (it calls drain first)
            nonlocal armed
            if not armed:
                armed = True
                rig.plan.armed.extend(faults)

        CountThenDrain.on_drain = arm
        rig.run_loop()  # returns once drained
        assert rig.reducer.errors >= 1, "the failures were noted and waited for"
        _drained_once(rig)
    finally:
        rig.close()


def test_a_store_down_for_a_while_during_the_drain_is_waited_for(rig: Rig) -> None:
    try:
        CountThenDrain.on_drain = _outage(rig, 8)  # down while the drain transaction runs
        rig.run_loop()
        assert "StoreUnavailableError" in rig.reducer.last_error
        _drained_once(rig)
    finally:
        rig.close()


def test_a_store_down_while_the_reducer_starts_is_waited_for(rig: Rig) -> None:
    try:
        rig.restart()  # a new instance, starting while the store is down
        _outage(rig, 6)()
        rig.run_loop()
        assert rig.reducer.errors >= 1, "the failures were noted and waited for"
        _drained_once(rig)
    finally:
        rig.close()
