"""The pane reducers' own records round-trip through a store opened anew.

Records under ``("~windows", r, what)`` (:mod:`millstream.event_time.store_layout`): the
watermarks (partition: latest event time), the watermark panes were last closed at, the
panes whose partials a rescale stored, the partials' schema (with the watermark field,
whose type is the time column's) and the late-row count. The partials themselves:
``test_partials_roundtrip.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import millstream as ms
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream.event_time import store_layout
from millstream.event_time.combiner import WATERMARK
from millstream.event_time.partials import START
from millstream.state import open_store
from millstream.state.keys import pack

TIMES = st.integers(-(2**63), 2**63 - 1)
TIME_TYPES = [
    pa.int64(),
    pa.timestamp("ms"),
    pa.timestamp("ns", tz="Asia/Kolkata"),
    pa.timestamp("s", tz="UTC"),
]
VALUE_TYPES = [pa.int8(), pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.timestamp("us")]


@settings(max_examples=40)
@given(
    reducer=st.integers(0, 127),
    marks=st.dictionaries(st.integers(0, 10_000), TIMES, max_size=6),
    closed=TIMES,
    panes=st.sets(TIMES, max_size=6),
    late=st.integers(0, 2**62),
    time_type=st.sampled_from(TIME_TYPES),
    key_type=st.sampled_from([pa.int64(), pa.string(), pa.int32()]),
    value_types=st.lists(st.sampled_from(VALUE_TYPES), min_size=1, max_size=4),
)
def test_a_pane_reducers_records_read_back(
    reducer: int,
    marks: dict[int, int],
    closed: int,
    panes: set[int],
    late: int,
    time_type: pa.DataType,
    key_type: pa.DataType,
    value_types: list[pa.DataType],
) -> None:
    schema = pa.schema(
        [
            pa.field(START, pa.int64()),
            pa.field("key", key_type),
            *(pa.field(f"_p{i}", t) for i, t in enumerate(value_types)),
            pa.field(WATERMARK, time_type),
        ]
    )
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'state.db'}"
        store = open_store(url, prefix=("p",))

        def write(txn: ms.Transaction) -> None:
            txn.set(store_layout.own_key(reducer, "watermarks"), store_layout.pack_marks(marks))
            txn.set(store_layout.own_key(reducer, "closed"), pack((closed,)))
            store_layout.write_stored_panes(txn, reducer, panes)
            txn.set(store_layout.own_key(reducer, "schema"), schema.serialize().to_pybytes())
            txn.add(store_layout.own_key(reducer, "late"), late)

        store.transact(lambda t: write(ms.Transaction(t)))
        store.close()
        store = open_store(url, prefix=("p",))
        try:
            with store.read() as raw:
                txn = ms.Transaction(raw)
                assert (
                    store_layout.read_marks(txn, store_layout.own_key(reducer, "watermarks"))
                    == marks
                )
                assert store_layout.read_int(txn, store_layout.own_key(reducer, "closed")) == closed
                assert store_layout.read_stored_panes(txn, reducer) == panes
                assert store_layout.read_schema(txn, reducer) == schema
                assert txn.get_int(store_layout.own_key(reducer, "late")) == late
        finally:
            store.close()
