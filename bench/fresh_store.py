"""A store a benchmark run may fill from empty: everything in it cleared first.

An embedded SQLite store is a new file per run; a FoundationDB cluster outlives the runs,
so a benchmark given one (``--store fdb://<cluster file>``) empties it before each run.
"""

from __future__ import annotations


def empty_store(url: str) -> None:
    """Clear every key of the store at ``url`` (meant for a cluster kept for benchmarks).

    millstream is imported here, not with this module: a Spark-only run never loads it."""
    from millstream.state import open_store

    store = open_store(url)
    try:
        store.transact(lambda txn: txn.clear_range_startswith(()))
    finally:
        store.close()
