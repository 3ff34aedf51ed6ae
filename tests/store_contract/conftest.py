"""Fixtures for the state store contract suite: every test runs on every available backend.

SQLite always runs, twice: as configured by default, and with every ``add_many`` kept as a
delta run. FoundationDB runs on the session's cluster (``fdb_url`` in ``tests/conftest.py``:
started from ``$MILLSTREAM_FDB_HOME`` or the installed binaries, or
``$MILLSTREAM_FDB_CLUSTER_FILE``); without binaries its cases are skipped with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from millstream.state import Store, StoreLimits, open_store

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    # Every add_many a delta run (millstream.state.sqlite.runs), so that reads, conflict
    # checks and mixed writes go through the runs as well as the table.
    pytest.param("sqlite-runs", id="sqlite-runs"),
    pytest.param("fdb", id="fdb", marks=pytest.mark.fdb),
]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL per backend (a fresh SQLite file; the FoundationDB cluster)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    if request.param == "sqlite-runs":
        return f"sqlite:///{tmp_path / 'store.db'}?run_min_keys=1"
    url: str = request.getfixturevalue("fdb_url")
    return url


StoreFactory = Callable[..., Store]


@pytest.fixture
def make_store(store_url: str) -> Iterator[StoreFactory]:
    """Open stores under one unique prefix (so runs on a shared cluster do not collide);
    everything under it is cleared afterwards."""
    prefix = ("millstream-test", uuid.uuid4().hex)
    opened: list[Store] = []

    def make(limits: StoreLimits | None = None) -> Store:
        store = open_store(store_url, prefix=prefix, limits=limits)
        opened.append(store)
        return store

    yield make
    cleaner = open_store(store_url, prefix=prefix)
    cleaner.transact(lambda txn: txn.clear_range_startswith(()))
    cleaner.close()
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """A store with FoundationDB's default limits under a unique prefix."""
    return make_store()
