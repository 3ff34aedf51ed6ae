"""Typed records: mapper and reducer state, discovery, status, processor metadata."""

from __future__ import annotations

import pytest
from millstream.exceptions import ConfigurationError, StoreConflictError
from millstream.state import OUTPUT, QUEUES, SYSTEM, Store
from millstream.state.records import (
    MapperState,
    ProcessorInfo,
    ReducerState,
    check_processor_info,
    freshest_workers,
    list_workers,
    read_mapper_state,
    read_processor_info,
    read_reducer_state,
    read_statuses,
    register_worker,
    remove_stale_workers,
    unregister_worker,
    write_mapper_state,
    write_reducer_state,
    write_worker_status,
)


def test_subspaces_are_distinct() -> None:
    assert len({SYSTEM, OUTPUT, QUEUES}) == 3


def test_mapper_state_round_trip_and_version(store: Store) -> None:
    assert store.transact(lambda t: read_mapper_state(t, 0)) == MapperState()
    first = store.transact(lambda t: write_mapper_state(t, 0, MapperState(10, 20, b"tok")))
    assert first == MapperState(10, 20, b"tok", 1)
    again = store.transact(lambda t: write_mapper_state(t, 0, MapperState(10, 20, b"tok", 1)))
    assert again.version == 2
    assert store.transact(lambda t: read_mapper_state(t, 0)) == again
    assert store.transact(lambda t: read_mapper_state(t, 1)) == MapperState()


def test_split_brain_mapper_writes_conflict(store: Store) -> None:
    store.transact(lambda t: write_mapper_state(t, 0, MapperState(1, 1, b"")))
    a = store.create_transaction()
    persisted = read_mapper_state(a, 0)
    store.transact(lambda t: write_mapper_state(t, 0, MapperState(1, 1, b"")))
    write_mapper_state(a, 0, MapperState(2, 2, b"", persisted.version))
    with pytest.raises(StoreConflictError):
        a.commit()
    assert store.transact(lambda t: read_mapper_state(t, 0)).version == 2


def test_reducer_state(store: Store) -> None:
    assert store.transact(lambda t: read_reducer_state(t, 0, 3)) == ReducerState((-1, -1, -1))
    store.transact(lambda t: write_reducer_state(t, 0, ReducerState((5, -1, 7))))
    assert store.transact(lambda t: read_reducer_state(t, 0, 3)).committed_row_indices == (
        5,
        -1,
        7,
    )
    with pytest.raises(ConfigurationError, match="number of mappers"):
        store.transact(lambda t: read_reducer_state(t, 0, 4))


def test_discovery_picks_the_freshest_entry(store: Store) -> None:
    store.transact(lambda t: register_worker(t, "mapper", 0, "old", "h:1", 100.0))
    store.transact(lambda t: register_worker(t, "mapper", 0, "new", "h:2", 200.0))
    store.transact(lambda t: register_worker(t, "mapper", 1, "m1", "h:3", 150.0, pid=7, host="x"))
    store.transact(lambda t: register_worker(t, "reducer", 0, "r0", "", 150.0))
    workers = store.transact(lambda t: list_workers(t, "mapper"))
    assert [(w.index, w.guid) for w in workers] == [(0, "new"), (0, "old"), (1, "m1")]
    assert workers[2].pid == 7
    assert workers[2].host == "x"
    fresh = freshest_workers(workers)
    assert fresh[0].address == "h:2"
    assert fresh[1].guid == "m1"
    assert store.transact(lambda t: remove_stale_workers(t, "mapper", 120.0)) == 1
    store.transact(lambda t: unregister_worker(t, "mapper", 1, "m1"))
    assert [w.guid for w in store.transact(lambda t: list_workers(t, "mapper"))] == ["new"]
    assert [w.guid for w in store.transact(lambda t: list_workers(t, "reducer"))] == ["r0"]
    with pytest.raises(ValueError, match="role"):
        store.transact(lambda t: list_workers(t, "combiner"))


def test_worker_status(store: Store) -> None:
    store.transact(lambda t: write_worker_status(t, "mapper", 0, {"lag": 0.5, "rows": 10}))
    store.transact(lambda t: write_worker_status(t, "reducer", 1, {"state": "running"}))
    statuses = store.transact(read_statuses)
    assert statuses == {
        ("mapper", 0): {"lag": 0.5, "rows": 10},
        ("reducer", 1): {"state": "running"},
    }
    with pytest.raises(TypeError, match="metric"):
        store.transact(lambda t: write_worker_status(t, "mapper", 0, {"bad": [1]}))  # type: ignore[dict-item]


def test_processor_info_refuses_mismatched_restart(store: Store) -> None:
    assert store.transact(read_processor_info) is None
    info = ProcessorInfo(num_mappers=2, num_reducers=3, fingerprint="wc")
    store.transact(lambda t: check_processor_info(t, info))
    store.transact(lambda t: check_processor_info(t, info))
    assert store.transact(read_processor_info) == info
    with pytest.raises(ConfigurationError, match="2 mappers, 3 reducers"):
        store.transact(lambda t: check_processor_info(t, ProcessorInfo(2, 4, "wc")))
