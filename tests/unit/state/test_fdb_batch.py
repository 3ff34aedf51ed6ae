"""The FoundationDB batch operations' guards: a binding that does not expose the C library
it loaded, null addresses and transactions, keys that are not a binary array without
nulls. Each is refused with a message that says what to pass, before any C call."""

from __future__ import annotations

import types

import pyarrow as pa
import pytest
from millstream import _core
from millstream.exceptions import MillstreamError, StoreUnavailableError
from millstream.state import open_store
from millstream.state.fdb_backend import BINDING_REQUIREMENT, FdbStore
from millstream.state.fdb_batch import C_FUNCTIONS, batch_operations


def test_a_binding_that_hides_its_c_library_is_refused_with_the_pin() -> None:
    other = types.ModuleType("fdb")
    with pytest.raises(StoreUnavailableError, match=BINDING_REQUIREMENT.replace("~", ".")):
        batch_operations(other)


def test_a_null_address_is_refused_by_name() -> None:
    addresses = dict.fromkeys(C_FUNCTIONS, 1) | {"future_get_value": 0}
    with pytest.raises(MillstreamError, match="fdb_future_get_value is null"):
        _core.FdbBatch(**addresses, error=RuntimeError)


@pytest.mark.fdb
def test_bad_transactions_and_keys_are_refused_before_any_call(fdb_url: str) -> None:
    store = open_store(fdb_url)
    assert isinstance(store, FdbStore)
    keys = pa.array([b"k"], pa.binary())
    with pytest.raises(MillstreamError, match="transaction pointer is null"):
        store.batch.get_many(0, keys, False)
    transaction = store.database.create_transaction()  # alive while its pointer is used
    pointer = transaction.tpointer
    with pytest.raises(MillstreamError, match="no nulls"):
        store.batch.set_many(pointer, pa.array([b"k", None]), pa.array([b"v", b"w"]))
    with pytest.raises(MillstreamError, match="binary array; got Int64"):
        store.batch.get_many(pointer, pa.array([1]), False)
    with pytest.raises(MillstreamError, match="1 keys came with 2 values"):
        store.batch.set_many(pointer, keys, pa.array([b"v", b"w"], pa.binary()))
    with pytest.raises(MillstreamError, match="pass 8 per key"):
        store.batch.add_many(pointer, keys, b"\x01" * 7)
    with pytest.raises(MillstreamError, match="whole int64 lanes"):
        store.batch.add_lanes(pointer, keys, b"\x01" * 12, 2)
