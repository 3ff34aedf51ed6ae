"""The state store the integration tests run on: SQLite, and FoundationDB where a test asks.

A test takes ``state_url`` (a SQLite file under its ``tmp_path`` by default) and runs on
FoundationDB too when parametrised with ``stores.ON_FDB`` (``indirect=["state_url"]``): the
session's cluster (``fdb_url`` in ``tests/conftest.py``), emptied before the test, so that
processors named alike in different tests never meet.

The Kafka tests take ``kafka_bootstrap``: a broker for the session (see
``tests.support.kafka_broker``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from millstream.state import open_store

from tests.support.kafka_broker import kafka_bootstrap_address


@pytest.fixture
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store URL of the test's processors: ``sqlite:///<tmp_path>/state.db`` or, for
    the ``fdb`` parameter, the session's FoundationDB cluster, emptied first."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    url: str = request.getfixturevalue("fdb_url")
    store = open_store(url)
    try:
        store.transact(lambda txn: txn.clear_range_startswith(()))
    finally:
        store.close()
    return url


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A Kafka broker's bootstrap address for the whole session (see kafka_broker)."""
    with kafka_bootstrap_address() as bootstrap:
        yield bootstrap
