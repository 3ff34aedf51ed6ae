"""The merge policy and the merge thread: runs of one size class merged into one, so that
reads fold few runs.

A merge is computed outside the write lock, by one process of a store at a time
(:class:`MergeLock`), on a thread of the committing process (:class:`RunMerger`), and
swapped in by a short write transaction; it changes no key's value.
"""

from __future__ import annotations

import fcntl
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from millstream.state.sqlite.run_cache import RunCache
from millstream.state.sqlite.runs import SQL_LIST_RUNS, EncodedRun, Run, RunInfo, insert_run
from millstream.state.sqlite.sql import begin_transaction

FANOUT = 8
"""Runs of one size class that merge into one."""

MERGE_ABOVE = 24
"""Runs kept before any merge: a job of a few dozen commits never merges (its output is
read once, at the end, when a range read sums the runs in one pass anyway); a longer one
merges a group whenever the runs exceed this, so reads fold at most about this many."""


def _size_class(entries: int, min_keys: int) -> int:
    base = max(min_keys, 1)
    return int(math.log(max(entries, base) / base, FANOUT) + 1e-9)


def merge_due(runs: list[RunInfo], min_keys: int) -> list[RunInfo]:
    """Runs to merge into one: when there are more than ``MERGE_ABOVE``, ``FANOUT`` runs of
    one size class (entries within a factor ``FANOUT`` of each other, counted from
    ``min_keys``), the smallest class that has that many; else none.

    The runs of one width that lie between runs of other widths commute (their deltas add
    lane by lane), so a group is any runs of such a stretch, not only neighbours: runs that
    two writers add in turn, or that merges left of several sizes, interleave, and a group
    of neighbours would seldom form. A stretch of more than ``MERGE_ABOVE`` runs without a
    full class merges its ``FANOUT`` smallest runs, so the runs stay few whatever their
    sizes.
    """
    if len(runs) <= MERGE_ABOVE:
        return []
    stretches: list[list[RunInfo]] = []
    for info in runs:
        if stretches and stretches[-1][0].width == info.width:
            stretches[-1].append(info)
        else:
            stretches.append([info])
    for stretch in stretches:
        classes: dict[int, list[RunInfo]] = {}
        for info in stretch:
            classes.setdefault(_size_class(info.entries, min_keys), []).append(info)
        for size in sorted(classes):
            if len(classes[size]) >= FANOUT:
                return classes[size][:FANOUT]
    longest = max(stretches, key=len)
    if len(longest) > MERGE_ABOVE:
        smallest = sorted(longest, key=lambda info: info.entries)[:FANOUT]
        return sorted(smallest, key=lambda info: info.ord)
    return []


class MergeLock:
    """One merger at a time among the processes of a store: the writers of a busy store
    all see the same group due and would each compute the same merge, of which all but
    one are thrown away. A non-blocking ``flock`` of a file beside the database (released
    by the kernel if its holder dies); a process that does not get it leaves the merge to
    the one that has it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()
        self._threads = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[bool]:
        """Whether this process holds the lock, for the ``with`` block."""
        if self._pid != os.getpid():
            # A forked child starts afresh: a lock taken through the parent's file would be
            # the parent's lock too, and the parent's threads may have held the other.
            self._fd, self._pid, self._threads = None, os.getpid(), threading.Lock()
        if not self._threads.acquire(blocking=False):
            yield False
            return
        try:
            fd = self._file()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def close(self) -> None:
        """Close the lock's file (this process's)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


def merge_runs(conn: sqlite3.Connection, cache: RunCache, min_keys: int, timeout_ms: int) -> int:
    """Merge runs while :func:`merge_due` finds a group; returns how many merges.

    The merge is computed from a read snapshot, outside the write lock (a merge of
    millions of keys takes seconds, which other writers must not wait for); a short write
    transaction then swaps the group for the merged run if the group is still there (a
    concurrent merge or fold may have taken it: then nothing is written). The merged run
    takes the place of the group's newest, so the runs' order is kept, and it holds the
    group's sums, so no key's value changes: no reader conflicts with a merge.
    """
    merges = 0
    while True:
        rows = begin_transaction(conn, ("BEGIN", SQL_LIST_RUNS), timeout_ms)
        try:
            group = merge_due([RunInfo(*row) for row in rows], min_keys)
            merged = Run.merge([cache.get(conn, info) for info in group]) if group else None
        finally:
            conn.execute("COMMIT")
        if merged is None:
            return merges
        encoded = EncodedRun.of_run(merged)
        ids = [info.id for info in group]
        begin_transaction(conn, ("BEGIN IMMEDIATE",), timeout_ms)
        try:
            marks = ",".join("?" * len(ids))
            (present,) = conn.execute(
                f"SELECT count(*) FROM runs WHERE id IN ({marks})", ids
            ).fetchone()
            if present != len(ids):
                conn.execute("ROLLBACK")
                return merges
            conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", ids)
            info = insert_run(conn, encoded, group[-1].ord)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        cache.put(info, merged)
        merges += 1


class RunMerger:
    """Merges runs on a thread of its own, so that the commit that made a merge due
    returns at once: a merge of big runs takes a tenth of a second and more, which a
    reducer would otherwise spend between its commits while rows wait for it.

    ``merge()`` does one round of merges (its own connection, the :class:`MergeLock`, its
    failures logged); :meth:`request` wakes the thread, started on first use in each
    process (a forked child starts its own).
    """

    def __init__(self, merge: Callable[[], None]) -> None:
        self._merge = merge
        self._pid = -1
        self._changed = threading.Condition()
        self._requested = 0
        """Requests so far; a round started after request ``n`` serves it."""
        self._served = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        """Merge soon (what is due then)."""
        if self._closed:
            return
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._changed = threading.Condition()  # the parent's threads may have held it
            self._requested = self._served = 0
            self._thread = threading.Thread(
                target=self._run, name="millstream-run-merger", daemon=True
            )
            self._thread.start()
        with self._changed:
            self._requested += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._requested > self._served)
                if self._closed:
                    return
                round_serves = self._requested
            self._merge()
            with self._changed:
                self._served = round_serves
                self._changed.notify_all()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the merges requested so far are done; False on timeout."""
        if self._thread is None or self._pid != os.getpid():
            return True
        with self._changed:
            wanted = self._requested
            return self._changed.wait_for(lambda: self._served >= wanted, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after the merge under way (none is left half done: a merge
        swaps its runs in one transaction)."""
        if self._pid != os.getpid():  # no thread here (a forked child's is its own)
            self._closed = True
            return
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None and self._pid == os.getpid():
            self._thread.join(timeout)
