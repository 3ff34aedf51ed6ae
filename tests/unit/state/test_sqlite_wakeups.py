"""The embedded store's wakes: pipes of waiters, and those of processes that died."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
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


def _key_folder(directory: Path) -> Path:
    (folder,) = directory.iterdir()
    return folder


def _reader(path: Path) -> int:
    """A reader of the pipe at ``path`` that does not block (as a waiter opens its own)."""
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def test_links_and_files_planted_beside_the_pipes_are_never_written(tmp_path: Path) -> None:
    directory = tmp_path / "db-watch"
    waiter = Wakeups(str(directory))
    pipe, _ = waiter.pipe(KEY)
    assert pipe is not None
    folder = _key_folder(directory)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (folder / "1-1").symlink_to(victim)
    (folder / "2-2").write_bytes(b"precious")
    waker = Wakeups(str(directory))
    waker.wake({KEY})
    waker.wake({KEY})
    assert victim.read_bytes() == b"precious"
    assert (folder / "2-2").read_bytes() == b"precious"
    assert _readable(pipe), "the waiter's own pipe was not woken"
    waiter.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_pipe_of_another_user_is_not_written(tmp_path: Path) -> None:
    directory = tmp_path / "db-watch"
    waiter = Wakeups(str(directory))
    pipe, _ = waiter.pipe(KEY)
    assert pipe is not None
    foreign = _key_folder(directory) / "3-3"
    os.mkfifo(foreign, 0o666)
    os.chown(foreign, 12345, 12345)
    listener = _reader(foreign)
    try:
        Wakeups(str(directory)).wake({KEY})
        assert not _readable(listener), "a wake was written into another user's pipe"
        assert _readable(pipe)
        # The owner of the database file owns the store, its pipes included.
        database = tmp_path / "db"
        database.touch()
        os.chown(database, 12345, 12345)
        Wakeups(str(directory), database=str(database)).wake({KEY})
        assert _readable(listener), "the store's owner's pipe was not woken"
    finally:
        os.close(listener)
        waiter.close()


def test_the_watch_directories_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "db-watch"
    waiter = Wakeups(str(directory))
    assert waiter.pipe(KEY)[0] is not None
    for made in (directory, _key_folder(directory)):
        assert made.stat().st_mode & 0o777 == 0o700, f"{made} is {made.stat().st_mode:o}"
    waiter.close()


def _give_away(path: Path) -> None:
    os.chown(path, 12345, 12345)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda path: path.chmod(0o777), id="others may write"),
        pytest.param(
            _give_away,
            id="another owner",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"),
        ),
    ],
)
def test_a_watch_directory_that_is_not_the_stores_own_is_ignored(
    tmp_path: Path, spoil: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "db-watch"
    first = Wakeups(str(directory))
    assert first.pipe(KEY)[0] is not None  # makes the folders
    planted = _key_folder(directory) / "4-4"
    os.mkfifo(planted, 0o600)
    listener = _reader(planted)
    spoil(directory)
    try:
        with caplog.at_level(logging.WARNING):
            Wakeups(str(directory)).wake({KEY})
            assert Wakeups(str(directory)).pipe(KEY) == (None, True)
        assert not _readable(listener), "a wake was written into an untrusted directory"
        assert f"ignoring {directory} among the store's wake-ups" in caplog.text
    finally:
        os.close(listener)
        first.close()


def test_a_waiter_whose_pipe_was_removed_makes_a_new_one(tmp_path: Path) -> None:
    directory = tmp_path / "db-watch"
    waiter = Wakeups(str(directory))
    pipe, _ = waiter.pipe(KEY)
    assert pipe is not None
    for path in _key_folder(directory).iterdir():
        path.unlink()  # as a waker that found no reader at the wrong moment did
    again, made = waiter.pipe(KEY)
    assert again is not None
    assert made, "the waiter kept a pipe no waker can find"
    Wakeups(str(directory)).wake({KEY})
    assert _readable(again)
    waiter.close()


def test_a_wake_between_making_and_opening_the_pipe_does_not_break_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "db-watch"
    waker = Wakeups(str(directory))
    made_fifo = os.mkfifo
    raced: list[str] = []

    def mkfifo_then_wake(path: str, mode: int = 0o666) -> None:
        made_fifo(path, mode)
        raced.append(path)
        waker.wake({KEY})  # the pipe exists and its waiter has not opened it yet

    monkeypatch.setattr(os, "mkfifo", mkfifo_then_wake)
    waiter = Wakeups(str(directory))
    pipe, made = waiter.pipe(KEY)
    monkeypatch.undo()
    assert raced, "the wake did not run between mkfifo and open"
    assert pipe is not None, "the waiter fell back to polling"
    assert made
    for _ in range(2):
        waker.wake({KEY})
        assert _readable(pipe), "the waiter is no longer woken by its pipe"
        waiter.sleep(pipe, 0)
    assert waiter.pipe(KEY) == (pipe, False)
    waiter.close()


def test_a_simulated_wait_advances_the_clock_without_blocking() -> None:
    clock = ManualClock()
    blocked: list[float] = []
    clock.wait(blocked.append, 0.25)
    assert clock.now() == 0.25
    assert blocked == []
