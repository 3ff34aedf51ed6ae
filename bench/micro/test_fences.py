"""The fences' reads (:mod:`millstream.workers.fencing`), each in a read transaction of its
own: a reducer commit's fences at least once with two serving mappers, and a mapper's check
of its persisted state after a read, both modes. On the embedded store and on a
one-process FoundationDB cluster started for the module (skipped without its binaries),
where each round trip counts: compare a checkout against another by running this module
under each (bench/README "The fences' reads in one round trip").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from millstream.ledger import (
    MapperState,
    ReducerState,
    write_mapper_state,
    write_numbering,
    write_reducer_state,
)
from millstream.state import Store, StoreTransaction, open_store
from millstream.workers.fencing import check_mapper_state, read_commit_fences

from tests.support.fdb_cluster import find_binaries, start_cluster

SERVED_BY = {0: "m0", 1: "m1"}


@pytest.fixture(scope="module", params=["sqlite", pytest.param("fdb", marks=pytest.mark.fdb)])
def fenced_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, MapperState]]:
    """A store holding reducer 0's state, two mappers' numbering owners and mapper 0's
    state (returned as written)."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("fences") / "state.db"
        store = open_store(f"sqlite:///{path}", prefix=("bench",))
        cluster = None
    else:
        binaries, missing = find_binaries(Path(__file__).resolve().parents[2])
        if binaries is None:
            pytest.skip(missing)
        cluster = start_cluster(binaries)
        store = open_store(cluster.url, prefix=("bench",))

    def seed(txn: StoreTransaction) -> MapperState:
        write_reducer_state(txn, 0, ReducerState((4, 5)))
        for m, guid in SERVED_BY.items():
            write_numbering(txn, m, guid)
        return write_mapper_state(txn, 0, MapperState(1, 1, b"t", 0))

    try:
        persisted: MapperState = store.transact(seed)
        yield store, persisted
        store.close()
    finally:
        if cluster is not None:
            cluster.stop()


FENCES: dict[str, Callable[[StoreTransaction, MapperState], object]] = {
    "commit_at_least_once": lambda txn, _: read_commit_fences(txn, 0, 2, SERVED_BY),
    "mapper_check_exactly_once": lambda txn, persisted: check_mapper_state(
        txn, 0, "m0", persisted, at_least_once=False
    ),
    "mapper_check_at_least_once": lambda txn, persisted: check_mapper_state(
        txn, 0, "m0", persisted, at_least_once=True
    ),
}


@pytest.mark.parametrize("fence", sorted(FENCES))
def test_fence(benchmark: Any, fenced_store: tuple[Store, MapperState], fence: str) -> None:
    """One fence in a read transaction of its own (the read version included)."""
    store, persisted = fenced_store
    read = FENCES[fence]

    def run() -> None:
        with store.read() as txn:
            read(txn, persisted)

    benchmark.pedantic(run, rounds=300, iterations=3, warmup_rounds=10)
