"""Every record millstream persists reads back as it was written, in a store opened anew
(as another process, or the same one restarted, reads it).

The inventory of persisted records (keys under the processor's prefix; ``SYSTEM``
records are listed in :mod:`millstream.ledger.subspaces`), each with the property test
that covers it:

- mapper state ``("mapper", m)``: :func:`test_mapper_state_reads_back`;
- batch plans ``("plan", m, begin)``, the drained marker ``("drained", m)``, the
  numbering owner ``("numbering", m)`` and totals ``("mapped", m, what)``:
  :func:`test_mapper_records_read_back`;
- the window schema ``("window_schema", m)`` (a mapper's mapped rows' unified schema):
  :func:`test_window_schema_reads_back`;
- reducer state ``("reducer", r)`` and totals ``("reduced", r, what)``:
  :func:`test_reducer_state_reads_back`;
- the processor's record ``("processor",)``: :func:`test_processor_info_reads_back`;
- rescale plans ``("rescale",)``: :func:`test_rescale_plan_reads_back`;
- spill chunks ``("spill", r, m, last)`` (written from the Rust window's
  ``peek_spill``, read with ``_core.decode_ipc``):
  :func:`test_spilled_rows_read_back_as_the_window_held_them`;
- discovery entries ``("workers", role, i, guid)``, registrations and statuses
  ``("status", role, i)``: :func:`test_discovery_entries_and_statuses_read_back`;
- dead letters ``("dead-letter", stage, ...)`` and their counters
  ``("dead-letter-count", stage, worker)``: ``tests/unit/ledger/test_dead_letter_records.py``;
- event-time pane partials ``("~windows", "partial", g, start, key)``:
  ``tests/unit/event_time/test_partials_roundtrip.py``;
- the pane reducers' own records ``("~windows", r, what)`` (watermarks, the close,
  the partials' schema, late rows, stored panes):
  ``tests/unit/event_time/test_pane_records_roundtrip.py``;
- store-queue rows, schema, bounds and producer records ``QUEUES + (name, p, ...)``:
  ``tests/unit/inputs/test_queue_records_roundtrip.py``;
- Parquet sink file records ``SINKS + (name, "file", f)`` (the files a commit
  published): ``tests/unit/outputs/test_sink_records_roundtrip.py``;
- values and counters the user's ``set``/``set_many``/``add``/``add_many`` write, kept
  in the SQLite table or as delta runs: ``tests/unit/state/test_store_records_roundtrip.py``;
- tuple keys and counter encodings (``state/keys.py``): ``tests/unit/state/test_state_keys.py``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from millstream import _core
from millstream.ledger import (
    MapperState,
    ProcessorInfo,
    ReducerState,
    drained_key,
    drained_mappers,
    list_workers,
    mapped_key,
    plan_key,
    read_mapper_state,
    read_numbering,
    read_processor_info,
    read_reducer_state,
    read_rescale,
    read_statuses,
    read_window_schema,
    reduced_key,
    register_worker,
    write_mapper_state,
    write_numbering,
    write_processor_info,
    write_reducer_state,
    write_window_schema,
    write_worker_status,
)
from millstream.ledger.rescale import begin_rescale
from millstream.ledger.spill import (
    clear_spill,
    read_spill,
    spill_pending,
    spilled_through,
    write_spill_chunk,
)
from millstream.state import Store, StoreTransaction, decode_int64, open_store
from millstream.state.keys import pack, unpack

T = TypeVar("T")

INDEX = st.integers(0, 2**63 - 1)
COMMITTED = st.integers(-1, 2**63 - 1)
TEXT = st.text(max_size=30)


@contextmanager
def _stores() -> Iterator[Callable[[], Store]]:
    """Opens the same store anew each call (closing the one before)."""
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'state.db'}"
        opened: list[Store] = []

        def reopen() -> Store:
            for store in opened:
                store.close()
            opened.clear()
            opened.append(open_store(url, prefix=("p",)))
            return opened[0]

        try:
            yield reopen
        finally:
            for store in opened:
                store.close()


def _round_trip(
    write: Callable[[StoreTransaction], Any], read: Callable[[StoreTransaction], T]
) -> T:
    """``write`` in one commit, then ``read`` from a store opened anew."""
    with _stores() as reopen:
        reopen().transact(write)
        with reopen().read() as txn:
            return read(txn)


@settings(max_examples=30)
@given(
    mapper=st.integers(0, 1000),
    states=st.lists(st.tuples(INDEX, INDEX, st.binary(max_size=64), INDEX), min_size=1, max_size=3),
)
def test_mapper_state_reads_back(mapper: int, states: list[tuple[int, int, bytes, int]]) -> None:
    """Each write bumps the version past the stored one; the rest reads back as written."""
    with _stores() as reopen:
        for input_index, shuffle_index, token, version in states:
            state = MapperState(input_index, shuffle_index, token, version)
            written = reopen().transact(lambda t, s=state: write_mapper_state(t, mapper, s))
            with reopen().read() as txn:
                assert read_mapper_state(txn, mapper) == written
            assert written.version >= version + 1
            assert (written.input_unread_row_index, written.continuation_token) == (
                input_index,
                token,
            )


@settings(max_examples=30)
@given(
    mapper=st.integers(0, 1000),
    begin=INDEX,
    end=INDEX,
    guid=st.text(max_size=40),
    batches=st.integers(-(2**63), 2**63 - 1),
)
def test_mapper_records_read_back(
    mapper: int, begin: int, end: int, guid: str, batches: int
) -> None:
    """A batch plan's end, the drained marker's input index, the numbering owner's GUID,
    and a total (an atomic add)."""

    def write(txn: StoreTransaction) -> None:
        txn.set(plan_key(mapper, begin), pack((end,)))
        txn.set(drained_key(mapper), pack((end,)))
        write_numbering(txn, mapper, guid)
        txn.add(mapped_key(mapper, "batches"), batches)

    def read(txn: StoreTransaction) -> tuple[Any, ...]:
        plan, drained, total = (
            txn.get(k)
            for k in (plan_key(mapper, begin), drained_key(mapper), mapped_key(mapper, "batches"))
        )
        assert plan is not None
        assert drained is not None
        assert total is not None
        return unpack(plan)[0], unpack(drained)[0], read_numbering(txn, mapper), decode_int64(total)

    assert _round_trip(write, read) == (end, end, guid, batches)


@settings(max_examples=30)
@given(num_partitions=st.integers(1, 40), data=st.data())
def test_the_drained_mappers_read_back(num_partitions: int, data: st.DataObject) -> None:
    """Whichever mappers set their drained marker, and only they, read back as drained."""
    drained = data.draw(st.sets(st.integers(0, num_partitions - 1)))

    def write(txn: StoreTransaction) -> None:
        for mapper in drained:
            txn.set(drained_key(mapper), pack((mapper,)))

    assert _round_trip(write, lambda txn: drained_mappers(txn, num_partitions)) == drained


FIELD_TYPES = st.sampled_from(
    [
        pa.int8(),
        pa.uint64(),
        pa.float16(),
        pa.float64(),
        pa.large_string(),
        pa.binary(),
        pa.dictionary(pa.int32(), pa.string()),
        pa.timestamp("us", "UTC"),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int32()), ("b", pa.string())]),
    ]
)


@settings(max_examples=30)
@given(
    mapper=st.integers(0, 1000),
    fields=st.lists(
        st.tuples(st.text(min_size=1, max_size=12), FIELD_TYPES, st.booleans()),
        max_size=6,
        unique_by=lambda f: f[0],
    ),
    metadata=st.dictionaries(TEXT, TEXT, max_size=2),
)
def test_window_schema_reads_back(
    mapper: int, fields: list[tuple[str, pa.DataType, bool]], metadata: dict[str, str]
) -> None:
    """Names, types (nested and dictionary ones too), nullability and metadata; absent
    until written."""
    schema = pa.schema([pa.field(n, t, nullable) for n, t, nullable in fields], metadata=metadata)
    with _stores() as reopen, reopen().read() as txn:
        assert read_window_schema(txn, mapper) is None
    got = _round_trip(
        lambda t: write_window_schema(t, mapper, schema), lambda t: read_window_schema(t, mapper)
    )
    assert got is not None
    assert got.equals(schema, check_metadata=True)


@settings(max_examples=30)
@given(
    reducer=st.integers(0, 1000),
    committed=st.lists(COMMITTED, min_size=1, max_size=8),
    rows=st.integers(0, 2**62),
)
def test_reducer_state_reads_back(reducer: int, committed: list[int], rows: int) -> None:
    state = ReducerState(tuple(committed))

    def write(txn: StoreTransaction) -> None:
        write_reducer_state(txn, reducer, state)
        txn.add(reduced_key(reducer, "rows"), rows)

    def read(txn: StoreTransaction) -> tuple[ReducerState, int]:
        total = txn.get(reduced_key(reducer, "rows"))
        assert total is not None
        return read_reducer_state(txn, reducer, len(committed)), decode_int64(total)

    assert _round_trip(write, read) == (state, rows)


PROCESSORS = st.builds(
    ProcessorInfo,
    num_partitions=st.integers(1, 10_000),
    num_reducers=st.integers(1, 10_000),
    fingerprint=st.text(max_size=60),
    delivery=st.sampled_from(["exactly_once", "at_least_once"]),
    key_groups=st.integers(1, 2**31),
)


@settings(max_examples=30)
@given(info=PROCESSORS)
def test_processor_info_reads_back(info: ProcessorInfo) -> None:
    assert _round_trip(lambda t: write_processor_info(t, info), read_processor_info) == info


@settings(max_examples=30)
@given(
    committed=st.lists(COMMITTED, min_size=1, max_size=6),
    reducers=st.integers(1, 4),
    target=st.integers(1, 128),
)
def test_rescale_plan_reads_back(committed: list[int], reducers: int, target: int) -> None:
    """The plan :func:`begin_rescale` records (per partition the last index any reducer
    committed) reads back equal, and a second ``begin_rescale`` returns it unchanged."""
    info = ProcessorInfo(len(committed), reducers, "wc")
    with _stores() as reopen:

        def setup(txn: StoreTransaction) -> None:
            write_processor_info(txn, info)
            for r in range(reducers):
                # Reducer r committed the partitions p with p % reducers == r.
                mine = tuple(c if p % reducers == r else -1 for p, c in enumerate(committed))
                write_reducer_state(txn, r, ReducerState(mine))

        reopen().transact(setup)
        plan = reopen().transact(lambda t: begin_rescale(t, info, target))
        assert plan.committed == tuple(committed)
        assert plan.num_reducers == target
        with reopen().read() as txn:
            assert read_rescale(txn) == plan
        assert reopen().transact(lambda t: begin_rescale(t, info, target)) == plan


SPILL_COLUMNS: dict[str, Callable[[np.random.Generator, int], pa.Array]] = {
    "int64": lambda rng, n: pa.array(rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)),
    "uint8": lambda rng, n: pa.array(rng.integers(0, 255, n, dtype=np.uint8)),
    "float32": lambda rng, n: pa.array(
        np.where(rng.random(n) < 0.2, np.nan, rng.standard_normal(n)).astype(np.float32)
    ),
    "string": lambda rng, n: pa.array(
        [None if i % 5 == 0 else "é" * (i % 7) for i in range(n)], pa.string()
    ),
    "binary": lambda rng, n: pa.array(
        [bytes(rng.integers(0, 255, i % 40, dtype=np.uint8)) for i in range(n)], pa.binary()
    ),
    "list": lambda rng, n: pa.array(
        [list(range(i % 4)) if i % 3 else None for i in range(n)], pa.list_(pa.int64())
    ),
    "struct": lambda rng, n: pa.array(
        [{"a": i, "b": str(i)} for i in range(n)],
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
    ),
    "timestamp": lambda rng, n: pa.array(rng.integers(0, 2**62, n), pa.timestamp("ns", tz="UTC")),
    "decimal": lambda rng, n: pa.array(rng.integers(-(10**9), 10**9, n)).cast(pa.decimal128(22, 2)),
    "dictionary": lambda rng, n: pa.array([str(i % 3) for i in range(n)]).dictionary_encode(),
}


@settings(max_examples=30)
@given(
    columns=st.lists(st.sampled_from(sorted(SPILL_COLUMNS)), min_size=1, max_size=4, unique=True),
    batches=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    chunk_bytes=st.integers(1, 4_000),
    page_bytes=st.integers(1, 8_000),
)
def test_spilled_rows_read_back_as_the_window_held_them(
    columns: list[str], batches: list[int], seed: int, chunk_bytes: int, page_bytes: int
) -> None:
    """A window spills the rows of reducer 0 (reducer 1 committed past them) in chunks of
    any size; a reducer reads them back from a store opened anew, in pages of any size,
    and decodes them as the reducer does: the rows the window held at those shuffle
    indices, with their types, in order, each once; ``spilled_through`` is the last of
    them and clearing through it leaves none."""
    rng = np.random.default_rng(seed)
    window = _core.Window(2, 1 << 30)
    wanted: list[pa.RecordBatch] = []
    owners: list[np.ndarray] = []
    end = 0
    for n in batches:
        batch = pa.record_batch({name: SPILL_COLUMNS[name](rng, n) for name in columns})
        reducers = pa.array(rng.integers(0, 2, n, dtype=np.int32))
        end += n
        window.push(batch, reducers, end, b"")
        wanted.append(batch)
        owners.append(reducers.to_numpy())
    window.get_rows(1, end - 1, 1, 1 << 20)  # reducer 1 committed every row
    chunks = window.peek_spill([0], 0, 1 << 30, chunk_bytes)
    if not chunks:  # the window keeps what it must (its newest entry, for one)
        return
    with _stores() as reopen:

        def write(txn: StoreTransaction) -> None:
            for reducer, _, last, _, payload in chunks:
                write_spill_chunk(txn, reducer, 0, last, payload)

        reopen().transact(write)
        read: list[tuple[int, bytes]] = []
        after = -1
        with reopen().read() as txn:
            while True:
                page, complete = read_spill(txn, 0, 0, after, page_bytes)
                read += page
                after = page[-1][0] if page else after
                if complete:
                    break
            through = spilled_through(txn, 0, 0)
        rows = _core.decode_ipc([payload for _, payload in read])
        reopen().transact(lambda t: clear_spill(t, 0, 0, through))
        with reopen().read() as txn:
            assert not spill_pending(txn, 0)
    indices = rows.column(_core.SHUFFLE_INDEX_COLUMN).to_pylist()
    mine = np.flatnonzero(np.concatenate(owners) == 0).tolist()
    assert indices == mine[: len(indices)], "a row missing, read twice or not reducer 0's"
    assert through == indices[-1] == chunks[-1][2]
    want = pa.Table.from_batches(wanted).take(pa.array(indices))
    got = pa.Table.from_batches([rows.drop_columns([_core.SHUFFLE_INDEX_COLUMN])])
    assert got.schema == want.schema
    assert _bits(got).equals(_bits(want))


def _bits(table: pa.Table) -> pa.Table:
    """Floats as their bits (NaN equals NaN), dictionaries decoded."""
    out = []
    for column in table.combine_chunks().columns:
        array = column.chunk(0) if column.num_chunks else pa.array([], column.type)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if pa.types.is_floating(array.type):
            array = array.view(pa.from_numpy_dtype(np.dtype(f"u{array.type.bit_width // 8}")))
        out.append(array)
    return pa.table(out, names=table.column_names)


METRICS = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=10),
    max_size=5,
)


@settings(max_examples=30)
@given(
    role=st.sampled_from(["mapper", "reducer"]),
    index=st.integers(0, 10_000),
    guid=TEXT,
    address=TEXT,
    heartbeat=st.floats(allow_nan=False),
    pid=st.integers(0, 2**31),
    host=TEXT,
    metrics=METRICS,
)
def test_discovery_entries_and_statuses_read_back(
    role: str,
    index: int,
    guid: str,
    address: str,
    heartbeat: float,
    pid: int,
    host: str,
    metrics: dict[str, Any],
) -> None:
    def write(txn: StoreTransaction) -> Any:
        entry = register_worker(txn, role, index, guid, address, heartbeat, pid=pid, host=host)
        write_worker_status(txn, role, index, metrics)
        return entry

    with _stores() as reopen:
        entry = reopen().transact(write)
        with reopen().read() as txn:
            assert list_workers(txn, role) == [entry]
            statuses = read_statuses(txn)
    assert list(statuses) == [(role, index)]
    got = statuses[(role, index)]
    assert got.keys() == metrics.keys()
    for name, value in metrics.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[name])
        else:
            assert got[name] == value
            assert type(got[name]) is type(value)
