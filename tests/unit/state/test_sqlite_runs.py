"""The embedded store's delta runs: stores that keep ``add_many`` batches as runs read,
conflict and write exactly like the table alone (FoundationDB's semantics)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from millstream.exceptions import StoreConflictError
from millstream.state import add_int64s, encode_int64, open_store
from millstream.state.keys import wrap_int64
from millstream.state.sqlite import run_merge, runs
from millstream.state.sqlite.run_merge import FANOUT, MERGE_ABOVE, MergeLock, RunMerger, merge_due
from millstream.state.sqlite.runs import Run, RunInfo
from millstream.state.sqlite.sql import SCHEMA_VERSION
from millstream.state.sqlite.store import SqliteStore

KEYS = st.integers(min_value=0, max_value=40)
LANES = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _add(model: dict[tuple, bytes], key: tuple, delta: bytes) -> None:
    model[key] = add_int64s(model.get(key), delta)


ADD_MANY = st.tuples(
    st.just("add_many"),
    st.lists(KEYS, min_size=1, max_size=30),
    st.integers(min_value=1, max_value=3),
    st.lists(LANES, min_size=90, max_size=90),
)
OPS = st.one_of(
    # Mostly batches, so that runs pile up and merge between the writes that fold them.
    ADD_MANY,
    ADD_MANY,
    ADD_MANY,
    ADD_MANY,
    st.tuples(st.just("add"), KEYS, LANES),
    st.tuples(st.just("set"), KEYS, st.binary(max_size=20)),
    st.tuples(st.just("clear"), KEYS),
    st.tuples(st.just("clear_range"), KEYS, KEYS),
)


def _apply(txn, model: dict[tuple, bytes], op: tuple) -> None:
    kind = op[0]
    if kind == "add_many":
        _, keys, width, lanes = op
        if width == 1:
            deltas = pa.array(lanes[: len(keys)], pa.int64())
            txn.add_many(("k",), pa.array(keys, pa.int64()), deltas)
            for k, d in zip(keys, lanes, strict=False):
                _add(model, ("k", k), encode_int64(d))
        else:
            columns = {
                f"c{n}": pa.array(lanes[n * 30 : n * 30 + len(keys)], pa.int64())
                for n in range(width)
            }
            txn.add_many(("k",), pa.array(keys, pa.int64()), pa.record_batch(columns))
            for i, k in enumerate(keys):
                raw = b"".join(encode_int64(lanes[n * 30 + i]) for n in range(width))
                _add(model, ("k", k), raw)
    elif kind == "add":
        txn.add(("k", op[1]), op[2])
        _add(model, ("k", op[1]), encode_int64(wrap_int64(op[2])))
    elif kind == "set":
        txn.set(("k", op[1]), op[2])
        model[("k", op[1])] = op[2]
    elif kind == "clear":
        txn.clear(("k", op[1]))
        model.pop(("k", op[1]), None)
    else:
        lo, hi = sorted(op[1:])
        txn.clear_range(("k", lo), ("k", hi))
        for key in [key for key in model if lo <= key[1] < hi]:
            del model[key]


def _check(txn, model: dict[tuple, bytes]) -> None:
    got = dict(txn.get_range_startswith(("k",)))
    assert got == {key: value for key, value in sorted(model.items())}
    for k in (0, 7, 20, 40):
        assert txn.get(("k", k)) == model.get(("k", k))
    keys = list(range(0, 41, 3))
    assert txn.get_many(("k",), keys) == [model.get(("k", k)) for k in keys]
    tail = txn.get_range(("k", 10), ("k", 30), limit=4, reverse=True)
    expected = sorted(((key, v) for key, v in model.items() if 10 <= key[1] < 30), reverse=True)
    assert tail == expected[:4]


@pytest.mark.parametrize("min_keys", [1, 40])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.lists(OPS, min_size=1, max_size=6), min_size=1, max_size=40))
def test_runs_read_and_write_as_the_table_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, min_keys: int, transactions
) -> None:
    """Random transactions (adds of several widths, sets, clears, cleared ranges) on a
    store whose every ``add_many`` is a run (``min_keys`` 1), or whose batches next to
    each other are one run once they hold 40 keys together (each holds at most 30), equal
    a model of FoundationDB's semantics, read back inside each transaction (with its own
    writes) and after each commit. Two runs of a size merge here once there are more than
    two (eight, beyond 24, by default), so merges happen between the rest."""
    monkeypatch.setattr(run_merge, "FANOUT", 2)
    monkeypatch.setattr(run_merge, "MERGE_ABOVE", 2)
    path = tmp_path / f"runs-{len(list(tmp_path.iterdir()))}.db"
    store = open_store(f"sqlite:///{path}?run_min_keys={min_keys}", prefix=("t",))
    model: dict[tuple, bytes] = {}
    try:
        for ops in transactions:
            txn = store.create_transaction()
            pending = dict(model)
            for op in ops:
                _apply(txn, pending, op)
            _check(txn, pending)
            txn.commit()
            model = pending
            with store.read() as reader:
                _check(reader, model)
    finally:
        store.close()


def test_many_runs_merge_and_stay_exact(tmp_path: Path) -> None:
    """Enough batches to merge runs twice over: the runs table stays short, every key's
    sum is exact, and a set on a key a run holds folds the runs into the table first."""
    store = open_store(f"sqlite:///{tmp_path / 's.db'}?run_min_keys=1")
    expected: dict[int, int] = {}
    for batch in range(MERGE_ABOVE + 3 * FANOUT):
        keys = [(batch * 7 + i) % 50 for i in range(20)]
        store.transact(
            lambda txn, keys=keys, batch=batch: txn.add_many(
                ("n",), pa.array(keys, pa.int64()), pa.array([batch + 1] * 20, pa.int64())
            )
        )
        for k in keys:
            expected[k] = expected.get(k, 0) + batch + 1
    assert isinstance(store, SqliteStore)
    assert store.merger.settle(30)  # merges run on a thread of their own
    conn = sqlite3.connect(tmp_path / "s.db")
    runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert 0 < runs <= MERGE_ABOVE
    with store.read() as txn:
        got = {key[1]: v for key, v in txn.get_range_startswith(("n",))}
    assert got == {k: encode_int64(v) for k, v in expected.items()}
    store.transact(lambda txn: txn.set(("n", 3), b"x"))
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    with store.read() as txn:
        assert txn.get(("n", 3)) == b"x"
        assert txn.get(("n", 4)) == encode_int64(expected[4])
    conn.close()
    store.close()


def test_a_run_on_a_read_key_is_a_conflict(tmp_path: Path) -> None:
    """A transaction that read a key conflicts with a run committed on it meanwhile, and
    not with a run on other keys."""
    store = open_store(f"sqlite:///{tmp_path / 's.db'}?run_min_keys=1")
    ints = pa.array([1, 2], pa.int64())
    store.transact(lambda txn: txn.add_many(("n",), ints, ints))
    reader = store.create_transaction()
    assert reader.get(("n", 1)) == encode_int64(1)
    store.transact(lambda txn: txn.add_many(("n",), pa.array([5, 6], pa.int64()), ints))
    reader.set(("other",), b"1")
    reader.commit()
    stale = store.create_transaction()
    stale.get_range_startswith(("n",))
    store.transact(lambda txn: txn.add_many(("n",), ints, ints))
    stale.set(("other",), b"2")
    with pytest.raises(StoreConflictError):
        stale.commit()
    store.close()


def test_a_commit_encodes_its_runs_before_it_takes_the_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sorting and encoding a batch's run is not done under the write lock, which every
    other writer waits for: another connection can write meanwhile, and the run holds the
    batch."""
    path = tmp_path / "s.db"
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    other = sqlite3.connect(path, timeout=0)
    other.execute("CREATE TABLE IF NOT EXISTS probe(n INTEGER)")
    wrote: list[bool] = []
    encode = Run.encode

    def encode_and_probe(run: Run) -> bytes:
        other.execute("BEGIN IMMEDIATE")  # SQLITE_BUSY at once if the lock were held
        other.execute("INSERT INTO probe VALUES (1)")
        other.execute("COMMIT")
        wrote.append(True)
        return encode(run)

    monkeypatch.setattr(Run, "encode", encode_and_probe)
    keys = pa.array([3, 1, 2, 1], pa.int64())
    store.transact(lambda txn: txn.add_many(("n",), keys, pa.array([1, 2, 3, 4], pa.int64())))
    assert wrote == [True]
    assert other.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    with store.read() as txn:
        got = {key[1]: v for key, v in txn.get_range_startswith(("n",))}
    assert got == {1: encode_int64(6), 2: encode_int64(3), 3: encode_int64(1)}
    other.close()
    store.close()


def test_runs_a_store_committed_or_merged_are_not_decoded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run enters the shared cache once the commit that wrote it landed, and a merged
    run once its merge did: the merges and reads after them decode nothing. A commit that
    rolled back leaves nothing there (tests/faults/test_run_cache.py)."""
    store = open_store(f"sqlite:///{tmp_path / 's.db'}?run_min_keys=1")
    assert isinstance(store, SqliteStore)
    decoded: list[int] = []
    decode = Run.decode.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Run], data: bytes) -> Run:
        run = decode(cls, data)
        decoded.append(len(run))
        return run

    monkeypatch.setattr(Run, "decode", classmethod(counting))
    expected: dict[int, int] = {}
    for batch in range(MERGE_ABOVE + 1):  # one merge due; every run fits the cache
        keys = list(range(batch * 10, batch * 10 + 10))
        store.transact(
            lambda txn, keys=keys: txn.add_many(
                ("n",), pa.array(keys, pa.int64()), pa.array(keys, pa.int64())
            )
        )
        expected.update({k: k for k in keys})
    assert store.merger.settle(30)
    with store.read() as txn:
        got = {key[1]: v for key, v in txn.get_range_startswith(("n",))}
    assert got == {k: encode_int64(v) for k, v in expected.items()}
    assert decoded == []
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == MERGE_ABOVE + 2 - FANOUT
    conn.close()
    store.close()


def test_a_version_1_store_opens_with_an_empty_runs_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = open_store(f"sqlite:///{path}")
    store.transact(lambda txn: txn.add(("n",), 5))
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE runs")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    store.transact(lambda txn: txn.add_many(("n",), pa.array([0]), pa.array([3])))
    with store.read() as txn:
        assert txn.get(("n",)) == encode_int64(5)
        assert txn.get(("n", 0)) == encode_int64(3)
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_run_encoding_round_trips_and_folds_repeats() -> None:
    keys = [b"pre\x01", b"pre\x00", b"pre\x01", b"pre"]
    run = Run.of_batch(keys, [1, 2, -(2**63), 4])
    assert run.keys.to_pylist() == [b"pre", b"pre\x00", b"pre\x01"]
    assert run.deltas[:, 0].tolist() == [4, 2, 1 - 2**63]
    back = Run.decode(run.encode())
    assert back.keys.to_pylist() == run.keys.to_pylist()
    assert back.delta(b"pre\x01") == encode_int64(1 - 2**63)
    assert back.delta(b"pre\x02") is None
    assert back.items(b"pre\x00", b"pre\x02") == [
        (b"pre\x00", encode_int64(2)),
        (b"pre\x01", encode_int64(1 - 2**63)),
    ]


def _as_version_2(data: bytes) -> bytes:
    """A run's bytes as store schema version 2 wrote them: the same batch in an IPC stream
    whose buffers Arrow compressed with zstd."""
    assert data.startswith(runs._ZSTD_RUN)
    batch = pa.ipc.open_stream(Run.stream(data)).read_next_batch()
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    earlier = sink.getvalue().to_pybytes()
    assert earlier.startswith(b"\xff\xff\xff\xff")
    return earlier


def test_runs_of_schema_version_2_decode_as_todays() -> None:
    rng = np.random.default_rng(3)
    keys = pa.array([b"sum\x15" + int(k).to_bytes(4, "big") for k in range(0, 5_000, 7)])
    run = Run.fold(keys, rng.integers(-(2**40), 2**40, size=(len(keys), 2)))
    data = run.encode()
    for stored in (_as_version_2(data), data):
        back = Run.decode(stored)
        assert back.keys.to_pylist() == run.keys.to_pylist()
        assert np.array_equal(back.deltas, run.deltas)


def test_a_version_2_store_opens_and_reads_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    for n in range(3):
        store.transact(
            lambda txn, n=n: txn.add_many(("n",), pa.array([0, n + 1]), pa.array([1, 2]))
        )
    store.close()
    conn = sqlite3.connect(path)
    stored = conn.execute("SELECT id, data FROM runs").fetchall()
    assert len(stored) == 3
    for run_id, data in stored:
        conn.execute("UPDATE runs SET data = ? WHERE id = ?", (_as_version_2(data), run_id))
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    store = open_store(f"sqlite:///{path}?run_min_keys=1")
    store.transact(lambda txn: txn.add_many(("n",), pa.array([0]), pa.array([4])))
    with store.read() as txn:
        assert txn.get(("n", 0)) == encode_int64(7)
        assert [txn.get(("n", k)) for k in (1, 2, 3)] == [encode_int64(2)] * 3
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    conn.close()


def test_default_threshold_batches_read_back_like_the_table(tmp_path: Path) -> None:
    """Batches over the default ``run_min_keys`` (runs) and a store that never makes runs
    hold the same values, read one at a time, in batches large and small, and by range."""
    rng = np.random.default_rng(7)
    stores = [
        open_store(f"sqlite:///{tmp_path / 'runs.db'}"),
        open_store(f"sqlite:///{tmp_path / 'table.db'}?run_min_keys=0"),
    ]
    for _ in range(3):
        keys = pa.array(rng.integers(0, 60_000, 20_000))
        counts = pa.array(rng.integers(-5, 5, 20_000))
        lanes = pa.record_batch({"a": counts, "b": pa.array(rng.integers(0, 9, 20_000))})
        for store in stores:
            store.transact(lambda txn, k=keys, c=counts: txn.add_many(("one",), k, c))
            store.transact(lambda txn, k=keys, b=lanes: txn.add_many(("two",), k, b))
    conn = sqlite3.connect(tmp_path / "runs.db")
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 6
    assert conn.execute("SELECT count(*) FROM kv").fetchone()[0] == 0
    conn.close()
    probes = [list(range(0, 60_000, 997)), list(range(0, 60_000, 3))]
    results = []
    for store in stores:
        with store.read() as txn:
            results.append(
                (
                    [txn.get_many((space,), keys) for space in ("one", "two") for keys in probes],
                    [txn.get((space, 123)) for space in ("one", "two")],
                    txn.get_range_startswith(("one",)),
                    txn.get_range_startswith(("two",)),
                    txn.get_range(("one", 100), ("one", 5000), limit=7, reverse=True),
                )
            )
        store.close()
    assert results[0] == results[1]


def _infos(*runs: tuple[int, int]) -> list[RunInfo]:
    """Runs of (width, entries), in order."""
    return [RunInfo(n, n, b"a", b"z", width, entries) for n, (width, entries) in enumerate(runs)]


def test_runs_of_one_width_merge_wherever_they_lie_between_other_widths() -> None:
    # Two writers' runs and earlier merges interleave sizes: the small ones merge although
    # no eight of them are neighbours; runs of another width split the stretches.
    sizes = [1_000, 9_000] * MERGE_ABOVE
    group = merge_due(_infos(*[(1, n) for n in sizes]), min_keys=1)
    assert [info.entries for info in group] == [1_000] * FANOUT
    assert [info.ord for info in group] == list(range(0, 2 * FANOUT, 2))
    # Same-width runs split by another width never merge together.
    split = ([(1, 1_000)] * (FANOUT - 1) + [(2, 1_000)]) * 4
    assert merge_due(_infos(*split), min_keys=1) == []
    # No class of eight, yet too many runs: the eight smallest merge.
    spread = [(1, 8**n * 10 + n) for n in range(7)] * 4
    group = merge_due(_infos(*spread), min_keys=1)
    assert len(group) == FANOUT
    assert sorted(info.entries for info in group) == sorted(n for _, n in spread)[:FANOUT]
    assert merge_due(_infos(*[(1, 1_000)] * MERGE_ABOVE), min_keys=1) == []


def _try_lock(path: str, result: multiprocessing.Queue) -> None:
    with MergeLock(path).held() as mine:
        result.put(mine)


def test_one_process_at_a_time_merges(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db-merge")
    lock = MergeLock(path)
    ctx = multiprocessing.get_context("fork")
    result: multiprocessing.Queue = ctx.Queue()
    with lock.held() as mine:
        assert mine
        with lock.held() as again:  # another thread of this process: not twice
            assert not again
        child = ctx.Process(target=_try_lock, args=(path, result))
        child.start()
        child.join(30)
        assert result.get(timeout=5) is False
    child = ctx.Process(target=_try_lock, args=(path, result))
    child.start()
    child.join(30)
    assert result.get(timeout=5) is True
    lock.close()


def test_the_merger_thread_serves_every_request_and_stops_on_close() -> None:
    rounds: list[int] = []
    release = threading.Event()

    def merge() -> None:
        release.wait(10)
        rounds.append(len(rounds))

    merger = RunMerger(merge)
    assert merger.settle(0)  # nothing asked yet
    merger.request()
    merger.request()  # while the first round runs: served by a round after it
    assert not merger.settle(0.05)
    release.set()
    assert merger.settle(10)
    assert 1 <= len(rounds) <= 2
    merger.close()
    merger.request()  # after close: nothing
    assert merger.settle(0.05)
    assert len(rounds) <= 2
