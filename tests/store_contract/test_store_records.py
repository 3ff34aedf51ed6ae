"""Typed records: mapper and reducer state, discovery, status, processor metadata."""

from __future__ import annotations

import pytest
from millstream.exceptions import ConfigurationError, StoreConflictError
from millstream.ledger import (
    OUTPUT,
    QUEUES,
    SYSTEM,
    MapperState,
    ProcessorInfo,
    ReducerState,
    RescalePlan,
    check_processor_info,
    freshest_workers,
    list_workers,
    plan_key,
    read_mapper_state,
    read_processor_info,
    read_reducer_state,
    read_rescale,
    read_statuses,
    reduced_key,
    reducer_state_key,
    register_worker,
    remove_stale_workers,
    unregister_worker,
    write_mapper_state,
    write_reducer_state,
    write_worker_status,
)
from millstream.ledger.rescale import begin_rescale, finish_rescale
from millstream.state import Store, StoreTransaction, decode_int64, pack


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
    with pytest.raises(ConfigurationError, match="partition count is fixed"):
        store.transact(lambda t: read_reducer_state(t, 0, 4))


def test_discovery_picks_the_newest_registration_not_the_latest_clock(store: Store) -> None:
    # The older instance's host clock runs an hour ahead: its heartbeat times are later.
    store.transact(lambda t: register_worker(t, "mapper", 0, "old", "h:1", 3_700.0))
    store.transact(lambda t: register_worker(t, "mapper", 1, "m1", "h:3", 150.0, pid=7, host="x"))
    store.transact(lambda t: register_worker(t, "reducer", 0, "r0", "", 150.0))
    store.transact(lambda t: register_worker(t, "mapper", 0, "old", "h:1", 3_701.0))
    # A new instance of mapper 0 registers; the old one (still alive) beats again after.
    new = store.transact(lambda t: register_worker(t, "mapper", 0, "new", "h:2", 200.0))
    old = store.transact(
        lambda t: register_worker(t, "mapper", 0, "old", "h:1", 3_702.0, registration=1)
    )
    assert (old.registration, new.registration) == (1, 3)
    workers = store.transact(lambda t: list_workers(t, "mapper"))
    assert [(w.index, w.guid) for w in workers] == [(0, "new"), (0, "old"), (1, "m1")]
    assert workers[2].pid == 7
    assert workers[2].host == "x"
    fresh = freshest_workers(workers)
    assert fresh[0].address == "h:2"
    assert fresh[1].guid == "m1"
    assert [w.guid for w in store.transact(lambda t: list_workers(t, "reducer"))] == ["r0"]
    with pytest.raises(ValueError, match="role"):
        store.transact(lambda t: list_workers(t, "combiner"))


def test_a_new_instance_removes_the_entries_it_supersedes(store: Store) -> None:
    store.transact(lambda t: register_worker(t, "mapper", 0, "a", "h:1", 1.0))
    store.transact(lambda t: register_worker(t, "mapper", 1, "b", "h:2", 1.0))
    store.transact(lambda t: register_worker(t, "mapper", 2, "c", "h:3", 1.0))
    # An instance of mapper 0 starts on mapper 1's old address: mapper 0's older entry and
    # whatever served on h:2 are gone; mapper 2 is untouched.
    store.transact(lambda t: register_worker(t, "mapper", 0, "d", "h:2", 1.0))
    workers = store.transact(lambda t: list_workers(t, "mapper"))
    assert [(w.index, w.guid) for w in workers] == [(0, "d"), (2, "c")]
    # Beats keep the registration and advance the counter.
    again = store.transact(lambda t: register_worker(t, "mapper", 0, "d", "h:2", 2.0))
    assert (again.registration, again.beats) == (workers[0].registration, 1)


def test_stale_entries_are_removed_unless_they_beat_since(store: Store) -> None:
    store.transact(lambda t: register_worker(t, "mapper", 0, "dead", "h:1", 1.0))
    store.transact(lambda t: register_worker(t, "mapper", 1, "live", "h:2", 1.0))
    seen = store.transact(lambda t: list_workers(t, "mapper"))
    store.transact(lambda t: register_worker(t, "mapper", 1, "live", "h:2", 2.0))
    assert store.transact(lambda t: remove_stale_workers(t, seen)) == 1
    assert [w.guid for w in store.transact(lambda t: list_workers(t, "mapper"))] == ["live"]
    # A removed instance that was alive after all comes back with its counter advanced, so
    # an observer that saw it before sees a change (not the same entry, dead again).
    dead = seen[0]
    back = store.transact(
        lambda t: register_worker(
            t, "mapper", 0, "dead", "h:1", 3.0, registration=dead.registration, beats=dead.beats
        )
    )
    assert (back.registration, back.beats) == (dead.registration, dead.beats + 1)
    store.transact(lambda t: unregister_worker(t, "mapper", 0, "dead"))
    store.transact(lambda t: unregister_worker(t, "mapper", 1, "live"))
    assert store.transact(lambda t: list_workers(t, "mapper")) == []


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
    info = ProcessorInfo(num_partitions=2, num_reducers=3, fingerprint="wc")
    store.transact(lambda t: check_processor_info(t, info))
    store.transact(lambda t: check_processor_info(t, info))
    assert store.transact(read_processor_info) == info
    with pytest.raises(ConfigurationError, match="2 partitions, 3 reducers"):
        store.transact(lambda t: check_processor_info(t, ProcessorInfo(3, 3, "wc")))
    with pytest.raises(ConfigurationError, match="millstream rescale <job>:processor --reducers 4"):
        store.transact(lambda t: check_processor_info(t, ProcessorInfo(2, 4, "wc")))
    with pytest.raises(ConfigurationError, match="128 key groups"):
        store.transact(lambda t: check_processor_info(t, ProcessorInfo(2, 3, "wc", key_groups=64)))
    # A record of the releases whose mappers read one partition each reads the same.
    legacy = (
        b'{"delivery": "exactly_once", "fingerprint": "wc", "num_mappers": 2, "num_reducers": 3}'
    )
    store.transact(lambda t: t.set((*SYSTEM, "processor"), legacy))
    assert store.transact(read_processor_info) == info


def test_a_rescale_hands_over_past_every_committed_row(store: Store) -> None:
    info = ProcessorInfo(num_partitions=2, num_reducers=2, fingerprint="wc")
    store.transact(lambda t: check_processor_info(t, info))

    def setup(t: StoreTransaction) -> None:
        write_mapper_state(t, 0, MapperState(10, 7))
        write_mapper_state(t, 1, MapperState(4, 3))
        write_reducer_state(t, 0, ReducerState((9, 1)))  # rows 7-9 only reducer 0 has
        write_reducer_state(t, 1, ReducerState((5, 2)))
        for r in (0, 1):
            t.add(reduced_key(r, "rows"), 10 + r)

    store.transact(setup)
    plan = store.transact(lambda t: begin_rescale(t, info, 3))
    assert plan == RescalePlan(3, (9, 2))
    assert store.transact(lambda t: begin_rescale(t, info, 3)) == plan  # resumed
    with pytest.raises(ConfigurationError, match="a rescale to 3 reducers is unfinished"):
        store.transact(lambda t: begin_rescale(t, info, 1))
    with pytest.raises(ConfigurationError, match="partition 0 persisted up to shuffle row 7"):
        store.transact(lambda t: finish_rescale(t, plan))

    def drained(t: StoreTransaction) -> None:  # the old reducers' run got past row 9
        write_mapper_state(t, 0, MapperState(15, 12))
        write_reducer_state(t, 0, ReducerState((11, 2)))
        write_reducer_state(t, 1, ReducerState((10, 2)))
        t.set(plan_key(0, 15), pack((20,)))  # read ahead, never committed

    store.transact(drained)
    rescaled = store.transact(lambda t: finish_rescale(t, plan))
    assert rescaled.num_reducers == 3
    with store.read() as t:
        assert read_processor_info(t) == rescaled
        assert read_rescale(t) is None
        for r in range(3):
            assert read_reducer_state(t, r, 2).committed_row_indices == (11, 2)
        assert t.get(plan_key(0, 15)) is None  # the new shape cuts those rows afresh
        assert read_mapper_state(t, 0).version > 1  # old instances see another's write
        assert decode_int64(t.get(reduced_key(0, "rows")) or b"") == 10
    # Back to one: reducers 1 and 2 go, their totals join reducer 0's.
    store.transact(lambda t: t.add(reduced_key(2, "rows"), 5))
    plan = store.transact(lambda t: begin_rescale(t, rescaled, 1))
    store.transact(lambda t: finish_rescale(t, plan))
    with store.read() as t:
        assert t.get(reducer_state_key(1)) is None
        assert decode_int64(t.get(reduced_key(0, "rows")) or b"") == 26
    with pytest.raises(ConfigurationError, match="128 key groups"):
        store.transact(lambda t: begin_rescale(t, rescaled, 129))
