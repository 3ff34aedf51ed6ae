"""The runs side of one commit: new runs added under the write lock, and every run folded
into the table when a write does not commute with them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

from millstream.state.sqlite.run_cache import RunCache
from millstream.state.sqlite.runs import SQL_DELETE_RUN, EncodedRun, Run, RunInfo, insert_run
from millstream.state.sqlite.sql import SQL_ADD, SQL_ADD_LANES

MAX_RUNS = 64
"""More runs than this (widths alternating so that none merge) fold into the table."""


class RunWriter:
    """The runs side of one commit, under the write lock: adds runs, and folds them into
    the table when a write needs it."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        cache: RunCache,
        runs: list[RunInfo],
    ) -> None:
        self.conn = conn
        self.cache = cache
        self.runs = runs
        self.added = False
        """Whether this commit wrote a run (then it, and only it, may merge after)."""
        self._own: dict[int, Run] = {}
        """The runs this commit wrote, by id: in the shared cache only once the commit
        landed (:meth:`committed`; see :class:`RunCache`)."""

    def committed(self) -> None:
        """The commit landed: the runs it wrote and kept are committed runs now, which the
        shared cache may hold (the next commit or merge then decodes none of them)."""
        for info in self.runs:
            own = self._own.get(info.id)
            if own is not None:
                self.cache.put(info, own)
        self._own = {}

    def run(self, info: RunInfo) -> Run:
        """The run ``info`` names: one this commit wrote, or a committed one."""
        own = self._own.get(info.id)
        return own if own is not None else self.cache.get(self.conn, info)

    def add(self, encoded: EncodedRun) -> None:
        """Store an ``add_many`` as a new run (merges come after the commit, outside
        the write lock: :func:`~millstream.state.sqlite.run_merge.merge_runs`)."""
        order = self.runs[-1].ord + 1 if self.runs else 0
        info = insert_run(self.conn, encoded, order)
        self._own[info.id] = encoded.run
        self.runs.append(info)
        self.added = True
        if len(self.runs) > MAX_RUNS:
            self.flush()

    def needs_flush(self, keys: Iterable[bytes], kind_width: Callable[[bytes], int]) -> bool:
        """Whether writing to ``keys`` must fold the runs into the table first: a run
        holds one of them and the write does not commute with it.

        ``kind_width(key)`` is the width of an add to the key (lanes), or 0 for a set or
        clear; a same-width add commutes with the runs (lane sums), anything else must
        come after them.
        """
        if not self.runs:
            return False
        for key in keys:
            for info in self.runs:
                if (
                    info.covers(key)
                    and kind_width(key) != info.width
                    and self.run(info).delta(key) is not None
                ):
                    return True
        return False

    def overlaps(self, begin: bytes, end: bytes) -> bool:
        """Whether a run holds a key in ``[begin, end)`` (a cleared range)."""
        return any(
            info.overlaps(begin, end) and self.run(info).holds_any(begin, end) for info in self.runs
        )

    def flush(self) -> None:
        """Fold every run into the table, oldest first, and drop them."""
        for info in self.runs:
            run = self.run(info)
            keys = run.keys.to_pylist()
            if run.width == 1:
                deltas: list[Any] = run.deltas[:, 0].tolist()
                self.conn.executemany(SQL_ADD, zip(keys, deltas, strict=True))
            else:
                self.conn.executemany(SQL_ADD_LANES, zip(keys, run.lanes(), strict=True))
            self.conn.execute(SQL_DELETE_RUN, (info.id,))
        self.runs = []
