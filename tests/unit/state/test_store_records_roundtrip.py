"""What a reducer writes into the store reads back as written, by every store that opens it.

Records: the values ``set``/``set_many`` write and the counters ``add``/``add_many`` write
(one int64 or several lanes per key), kept in the SQLite table or, for ``add_many``
batches, as delta runs (:mod:`millstream.state.sqlite.runs`: encoded, folded into reads,
merged, and folded into the table when a key is written). Two stores open the same file
as two processes would (each with its own run cache), commit in turn, and both, and a
third opened at the end, read every key (``get``, ``get_many``, ranges) as a model of
FoundationDB's semantics has it. Runs merge here after every second one of a size.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream.state import Store, StoreTransaction, add_int64s, encode_int64, open_store
from millstream.state.keys import wrap_int64
from millstream.state.sqlite import run_merge

INT64 = st.integers(-(2**63), 2**63 - 1)
KEYSPACES: dict[str, tuple[st.SearchStrategy[Any], pa.DataType]] = {
    "int": (st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3), pa.int64()),
    "uint": (st.integers(0, 2**64 - 1) | st.integers(0, 3), pa.uint64()),
    "str": (st.text(max_size=4), pa.string()),
    "bytes": (st.binary(max_size=4), pa.binary()),
}
"""Key types a batch takes, each under its own keyspace."""

Model = dict[tuple[Any, ...], bytes]


@st.composite
def operations(draw: st.DrawFn) -> tuple[Any, ...]:
    space = draw(st.sampled_from(sorted(KEYSPACES)))
    key = KEYSPACES[space][0]
    kind = draw(st.sampled_from(["add_many", "add_many", "set_many", "add", "set", "clear"]))
    if kind == "add_many":
        keys = draw(st.lists(key, min_size=1, max_size=12))
        width = draw(st.integers(1, 3))
        lanes = [
            draw(st.lists(INT64, min_size=len(keys), max_size=len(keys))) for _ in range(width)
        ]
        return (kind, space, keys, lanes)
    if kind == "set_many":
        keys = draw(st.lists(key, min_size=1, max_size=8, unique=True))
        values = draw(st.lists(st.binary(max_size=24), min_size=len(keys), max_size=len(keys)))
        return (kind, space, keys, values)
    if kind == "add":
        return (kind, space, draw(key), draw(INT64))
    if kind == "set":
        return (kind, space, draw(key), draw(st.binary(max_size=24)))
    return (kind, space, draw(key))


def _apply(txn: StoreTransaction, model: Model, op: tuple[Any, ...]) -> None:
    kind, space = op[0], op[1]
    if kind == "add_many":
        _, _, keys, lanes = op
        array = pa.array(keys, KEYSPACES[space][1])
        if len(lanes) == 1:
            txn.add_many((space,), array, pa.array(lanes[0], pa.int64()))
        else:
            batch = pa.record_batch({f"c{n}": pa.array(c, pa.int64()) for n, c in enumerate(lanes)})
            txn.add_many((space,), array, batch)
        for i, k in enumerate(keys):
            delta = b"".join(encode_int64(column[i]) for column in lanes)
            model[(space, k)] = add_int64s(model.get((space, k)), delta)
    elif kind == "set_many":
        _, _, keys, values = op
        txn.set_many((space,), pa.array(keys, KEYSPACES[space][1]), pa.array(values, pa.binary()))
        model.update({(space, k): v for k, v in zip(keys, values, strict=True)})
    elif kind == "add":
        txn.add((space, op[2]), op[3])
        delta = encode_int64(wrap_int64(op[3]))
        model[(space, op[2])] = add_int64s(model.get((space, op[2])), delta)
    elif kind == "set":
        txn.set((space, op[2]), op[3])
        model[(space, op[2])] = op[3]
    else:
        txn.clear((space, op[2]))
        model.pop((space, op[2]), None)


def _check(store: Store, model: Model) -> None:
    with store.read() as txn:
        for space, (_, kind) in KEYSPACES.items():
            want = {k: v for k, v in model.items() if k[0] == space}
            got = dict(txn.get_range_startswith((space,)))
            assert got == want, space
            keys = [k[1] for k in want]
            if keys:
                assert txn.get_many((space,), pa.array(keys, kind)) == list(want.values())
                assert txn.get((space, keys[-1])) == want[(space, keys[-1])]


@pytest.fixture(autouse=True)
def _merge_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of a size merge once there are more than two (eight beyond 24 by default)."""
    monkeypatch.setattr(run_merge, "FANOUT", 2)
    monkeypatch.setattr(run_merge, "MERGE_ABOVE", 2)


@settings(max_examples=40)
@given(
    commits=st.lists(
        st.tuples(st.integers(0, 1), st.lists(operations(), min_size=1, max_size=3)),
        min_size=1,
        max_size=12,
    )
)
def test_values_and_counters_read_back_in_every_store_that_opens_them(
    commits: list[tuple[int, list[tuple[Any, ...]]]],
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'state.db'}?run_min_keys=1"
        stores = [open_store(url, prefix=("t",)) for _ in range(2)]
        model: Model = {}
        try:
            for writer, ops in commits:
                txn = stores[writer].create_transaction()
                pending = dict(model)
                for op in ops:
                    _apply(txn, pending, op)
                txn.commit()
                model = pending
                for store in stores:
                    _check(store, model)
            for store in stores:
                store.close()
            stores = [open_store(url, prefix=("t",))]
            _check(stores[0], model)
        finally:
            for store in stores:
                store.close()
