"""Waking the processes that wait for a key of the embedded store to change.

SQLite tells no other process that a transaction committed, so a reader waiting for rows
(a mapper at the end of its queue partition) would have to poll the file. Instead, a waiter
makes a named pipe (FIFO) in a directory of the key, beside the database
(``<db>-watch/<digest of the key>/<pid>-<thread>``), and sleeps on it; a writer whose
transaction named the key (:meth:`~millstream.state.StoreTransaction.wake_on_commit`)
writes one byte into every pipe of that directory once it committed.

A waiter opens its pipe for reading and writing, so the pipe never reports the end of its
writers (which would wake it for ever) and a writer's non-blocking open finds a reader as
long as the waiter's process lives; a writer that finds none (the process died) removes the
pipe. The waiter makes its pipe under a hidden name (``.<pid>-<thread>``), which writers
skip, opens it, and only then renames it into place, so a writer never finds a live
waiter's pipe without its reader; a waiter whose pipe is gone all the same (removed by
hand) makes a new one. Wakes are hints: a waiter reads the key again after each, and waits
at most its timeout, so a lost wake costs one timeout, never a row.

The directory names are computable from the keys and the store may live in a shared
directory (``/tmp``), so nothing there is taken on trust: the directories are made
``0700``; a watch directory (or a key's) that is a link, or that is owned by anyone but
the store's owner (the owner of the database file, or this process's user), or that others
may write, is ignored with a warning (its waiters poll the store instead); and a writer
writes only into pipes of those owners, opened without following links.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import math
import os
import select
import stat
import threading
from typing import NamedTuple

log = logging.getLogger(__name__)

_DIGEST_BYTES = 12
"""Bytes of the key's digest that name its directory."""

_HIDDEN = "."
"""Prefix of a pipe being made (writers skip it: its reader is not there yet)."""


class _Pipe(NamedTuple):
    path: str
    fd: int
    device: int
    inode: int


class Wakeups:
    """The watch directory of one database: waiters' pipes and writers' wakes.

    Args:
        directory: Where the pipes live (created when first needed).
        database: The database file: its owner owns the store (with this process's user).
    """

    def __init__(self, directory: str, database: str | None = None) -> None:
        self._directory = directory
        self._database = database
        self._lock = threading.Lock()
        self._pipes: dict[tuple[bytes, int], _Pipe] = {}
        self._pid = os.getpid()
        self._broken = False
        self._owners: frozenset[int] | None = None
        self._refused: set[str] = set()

    def _key_directory(self, raw_key: bytes) -> str:
        digest = hashlib.blake2b(raw_key, digest_size=_DIGEST_BYTES).hexdigest()
        return os.path.join(self._directory, digest)

    def _trusted_owners(self) -> frozenset[int]:
        """The users whose directories and pipes are the store's own."""
        if self._owners is None:
            owners = {os.geteuid()}
            if self._database is not None:
                with contextlib.suppress(OSError):
                    owners.add(os.stat(self._database).st_uid)
            self._owners = frozenset(owners)
        return self._owners

    def _refuse(self, path: str, reason: str) -> None:
        if path not in self._refused:
            self._refused.add(path)
            log.warning(
                "ignoring %s among the store's wake-ups: %s, not the store's (its owners: "
                "uid %s). Waiters there poll the store instead of sleeping on pipes. Remove "
                "it (the store makes its own, mode 0700), or keep the store in a directory "
                "only its owner can write",
                path,
                reason,
                ", ".join(map(str, sorted(self._trusted_owners()))),
            )

    def _trusted_directory(self, path: str) -> bool:
        """Whether ``path`` is a directory (not a link) of the store's owners that nobody
        else may write; False without a word when it does not exist."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            self._refuse(path, "not a directory (a link or a file)")
        elif st.st_uid not in self._trusted_owners():
            self._refuse(path, f"a directory owned by uid {st.st_uid}")
        elif st.st_mode & 0o022:
            self._refuse(path, f"a directory others may write (mode {stat.S_IMODE(st.st_mode):o})")
        else:
            return True
        return False

    def _trusted_pipe(self, path: str, st: os.stat_result) -> bool:
        if stat.S_ISFIFO(st.st_mode) and st.st_uid in self._trusted_owners():
            return True
        kind = "a named pipe" if stat.S_ISFIFO(st.st_mode) else "not a named pipe (a link or file)"
        self._refuse(path, f"{kind} owned by uid {st.st_uid}")
        return False

    def _private_directory(self, path: str) -> bool:
        """Make directory ``path`` (mode 0700) unless it exists; whether it is trusted."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        return self._trusted_directory(path)

    def _make_pipe(self, raw_key: bytes) -> _Pipe | None:
        """A new pipe of this thread for ``raw_key``, open for reading before writers see
        it; None when pipes cannot be made here."""
        folder = self._key_directory(raw_key)
        name = f"{os.getpid()}-{threading.get_ident()}"
        path, hidden = os.path.join(folder, name), os.path.join(folder, _HIDDEN + name)
        try:
            if not (self._private_directory(self._directory) and self._private_directory(folder)):
                return None
            _remove(hidden)  # left by a process of this id that died making it
            os.mkfifo(hidden, 0o600)
            fd = os.open(hidden, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                os.rename(hidden, path)
            except OSError:
                os.close(fd)
                raise
        except OSError:
            return None  # a read-only directory, a file system without pipes
        return _Pipe(path, fd, st.st_dev, st.st_ino)

    def pipe(self, raw_key: bytes) -> tuple[int | None, bool]:
        """This thread's pipe for ``raw_key`` and whether this call made it (then wakes
        sent before were lost: read the key before sleeping); None when pipes cannot be
        made here (then waiters sleep instead).

        The pipe stays open between waits and keeps the wakes sent meanwhile, so a waiter
        that reads, finds nothing and sleeps wakes at once for a commit after its read."""
        if self._pid != os.getpid():  # a forked child: the parent's pipes are not its own
            self._pipes, self._pid = {}, os.getpid()
        slot = (raw_key, threading.get_ident())
        with self._lock:
            entry = self._pipes.get(slot)
            if entry is not None and not _in_place(entry):  # removed: wakes miss it
                del self._pipes[slot]
                os.close(entry.fd)
                entry = None
            made = entry is None
            if entry is None and not self._broken:
                entry = self._make_pipe(raw_key)
                if entry is None:
                    self._broken = True
                    return None, made
                self._pipes[slot] = entry
        return (None if entry is None else entry.fd), made

    @staticmethod
    def sleep(fd: int, timeout_seconds: float) -> None:
        """Sleep until pipe ``fd`` holds a wake (at once if one came since the last
        sleep), at most ``timeout_seconds``; takes the wakes out."""
        poller = select.poll()  # not select(): descriptors past 1024 are common in workers
        poller.register(fd, select.POLLIN)
        if poller.poll(max(0, math.ceil(timeout_seconds * 1000))):
            _drain(fd)

    def wake(self, raw_keys: set[bytes]) -> None:
        """Wake every waiter of each of ``raw_keys``; removes the pipes of dead processes."""
        if not self._trusted_directory(self._directory):
            return  # nobody ever waited here, or not a directory of ours
        for raw_key in raw_keys:
            folder = self._key_directory(raw_key)
            if not self._trusted_directory(folder):
                continue
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if not name.startswith(_HIDDEN):
                    self._wake_one(os.path.join(folder, name))

    def _wake_one(self, path: str) -> None:
        try:
            if not self._trusted_pipe(path, os.lstat(path)):
                return
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader: its process is gone
                _remove(path)
            return
        try:
            if self._trusted_pipe(path, os.fstat(fd)):  # still the pipe looked at
                # A full pipe (BlockingIOError) holds wakes the waiter has not read yet.
                with contextlib.suppress(OSError):
                    os.write(fd, b"\0")
        finally:
            os.close(fd)

    def close(self) -> None:
        """Remove this process's pipes."""
        with self._lock:
            pipes, self._pipes = self._pipes, {}
        if self._pid != os.getpid():
            return
        for entry in pipes.values():
            if _in_place(entry):
                _remove(entry.path)
            os.close(entry.fd)
            with contextlib.suppress(OSError):  # the key's folder, once no waiter is left
                os.rmdir(os.path.dirname(entry.path))
        if pipes:
            with contextlib.suppress(OSError):
                os.rmdir(self._directory)


def _in_place(pipe: _Pipe) -> bool:
    """Whether ``pipe`` is still the file at its path (nobody removed or replaced it)."""
    try:
        st = os.lstat(pipe.path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (pipe.device, pipe.inode)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
