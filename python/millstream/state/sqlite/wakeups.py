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
pipe. Wakes are hints: a waiter reads the key again after each, and waits at most its
timeout, so a lost wake costs one timeout, never a row.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import select
import threading

_DIGEST_BYTES = 12
"""Bytes of the key's digest that name its directory."""


class Wakeups:
    """The watch directory of one database: waiters' pipes and writers' wakes.

    Args:
        directory: Where the pipes live (created when first needed).
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._pipes: dict[tuple[bytes, int], tuple[str, int]] = {}
        self._pid = os.getpid()
        self._broken = False

    def _key_directory(self, raw_key: bytes) -> str:
        digest = hashlib.blake2b(raw_key, digest_size=_DIGEST_BYTES).hexdigest()
        return os.path.join(self._directory, digest)

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
            made = entry is None
            if entry is None and not self._broken:
                folder = self._key_directory(raw_key)
                path = os.path.join(folder, f"{os.getpid()}-{threading.get_ident()}")
                try:
                    os.makedirs(folder, exist_ok=True)
                    if not os.path.exists(path):
                        os.mkfifo(path, 0o600)
                    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
                except OSError:
                    self._broken = True  # a read-only directory, a file system without pipes
                    return None, made
                entry = (path, fd)
                self._pipes[slot] = entry
        return (None if entry is None else entry[1]), made

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
        for raw_key in raw_keys:
            folder = self._key_directory(raw_key)
            try:
                names = os.listdir(folder)
            except OSError:
                continue  # nobody ever waited for this key
            for name in names:
                path = os.path.join(folder, name)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no reader: its process is gone
                        _remove(path)
                    continue
                try:
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
        for path, fd in pipes.values():
            os.close(fd)
            _remove(path)
            with contextlib.suppress(OSError):  # the key's folder, once no waiter is left
                os.rmdir(os.path.dirname(path))
        if pipes:
            with contextlib.suppress(OSError):
                os.rmdir(self._directory)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
