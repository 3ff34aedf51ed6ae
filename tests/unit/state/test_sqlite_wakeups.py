"""The embedded store's wakes: pipes of waiters, and those of processes that died."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from millstream.state.sqlite.wakeups import Wakeups
from millstream.workers.clock import ManualClock

KEY = b"\x01queue\x00end"


def test_a_wake_reaches_a_waiter_that_is_not_asleep_yet(tmp_path: Path) -> None:
    waiter = Wakeups(str(tmp_path / "db-watch"))
    pipe, made = waiter.pipe(KEY)
    assert pipe is not None
    assert made
    Wakeups(str(tmp_path / "db-watch")).wake({KEY})
    # Kept in the pipe: the sleep after it returns at once, and takes the wake out.
    waiter.sleep(pipe, 120.0)
    assert waiter.pipe(KEY) == (pipe, False)
    assert not _readable(pipe)
    waiter.close()
    assert not list((tmp_path / "db-watch").rglob("*-*"))


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_the_pipe_of_a_process_that_died_is_removed_by_the_next_wake(tmp_path: Path) -> None:
    directory = str(tmp_path / "db-watch")
    child = os.fork()
    if child == 0:
        Wakeups(directory).pipe(KEY)
        os._exit(0)  # dies without closing: its pipe stays behind
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(list(Path(directory).rglob("*-*"))) == 1
    Wakeups(directory).wake({KEY})
    assert not list(Path(directory).rglob("*-*"))


def test_a_simulated_wait_advances_the_clock_without_blocking() -> None:
    clock = ManualClock()
    blocked: list[float] = []
    clock.wait(blocked.append, 0.25)
    assert clock.now() == 0.25
    assert blocked == []
