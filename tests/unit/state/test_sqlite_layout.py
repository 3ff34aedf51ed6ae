"""The embedded store's table layout: a small key's read does not read large values."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from millstream.state import open_store

LARGE = 50_000
"""Bytes of each large value (a queue chunk's size): it overflows onto a dozen pages."""


def _bytes_read() -> int:
    """Bytes this process has read through system calls so far (``rchar``, page cache hits
    included: what SQLite asked the file system for)."""
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _bytes_to_read_small_keys(path: Path) -> int:
    """Bytes read by one read of four small keys stored among large values, in a new
    transaction after another connection's commit (which empties the reader's page cache)."""
    writer = open_store(f"sqlite:///{path}")
    reader = open_store(f"sqlite:///{path}")
    try:
        for i in range(300):
            writer.transact(
                lambda t, i=i: (
                    t.set(("chunk", i), bytes([i % 251]) * LARGE),
                    t.set(("small", i), i.to_bytes(8, "little")),
                )
            )
        small = [("small", i) for i in (7, 101, 202, 299)]
        reader.transact(lambda t: [t.get(k) for k in small])  # connection and statements warm
        writer.transact(lambda t: t.set(("chunk", 0), b"\1" * LARGE))
        before = _bytes_read()
        values = reader.transact(lambda t: [t.get(k) for k in small])
        read = _bytes_read() - before
        assert values == [i.to_bytes(8, "little") for i in (7, 101, 202, 299)]
        return read
    finally:
        reader.close()
        writer.close()


def test_a_small_key_is_read_without_the_large_values_beside_it(tmp_path: Path) -> None:
    read = _bytes_to_read_small_keys(tmp_path / "store.db")
    assert read < 96 * 1024  # ~10 pages: the b-trees' paths to four keys, the runs' list
    # The layout before (a WITHOUT ROWID table, whose interior pages hold whole rows) read
    # the overflow pages of every large value its search compared with: 8 times as much.
    old = tmp_path / "without_rowid.db"
    with closing(sqlite3.connect(old)) as conn:
        conn.execute(
            "CREATE TABLE kv (key BLOB PRIMARY KEY NOT NULL, value NOT NULL) WITHOUT ROWID"
        )
    assert _bytes_to_read_small_keys(old) > 4 * read
