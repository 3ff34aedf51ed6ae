"""Stable hash partitioning: golden vectors pin the hash across processes and releases."""

from __future__ import annotations

import pyarrow as pa
import pytest
from millstream._core import MillstreamError, hash_keys, hash_partition

# Part of millstream's format; the same numbers are pinned in rust/millstream-core.
GOLDEN_HASHES = {
    "null": 0xC44BDFF4074EECDB,
    "int 0": 0x313C2DD2EC996E80,
    "int 5": 0xD7AAC30B7EE829FB,
    "int -1": 0x53A5F4BC2FC0168C,
    "uint64 max": 0x51957C455B8E6C65,
    "apple": 0x89C789FBEFEDB452,
    "empty string": 0x13E608BC156DEFED,
    "apple bytes": 0xF539602A644B22F0,
}


def one(array: pa.Array) -> int:
    return hash_keys(pa.record_batch({"k": array}), ["k"])[0].as_py()


def test_golden_value_hashes() -> None:
    assert one(pa.array([None], pa.int64())) == GOLDEN_HASHES["null"]
    assert one(pa.array([None], pa.string())) == GOLDEN_HASHES["null"]
    assert one(pa.array([0], pa.int8())) == GOLDEN_HASHES["int 0"]
    assert one(pa.array([5], pa.int64())) == GOLDEN_HASHES["int 5"]
    assert one(pa.array([-1], pa.int16())) == GOLDEN_HASHES["int -1"]
    assert one(pa.array([2**64 - 1], pa.uint64())) == GOLDEN_HASHES["uint64 max"]
    assert one(pa.array(["apple"])) == GOLDEN_HASHES["apple"]
    assert one(pa.array([""])) == GOLDEN_HASHES["empty string"]
    assert one(pa.array([b"apple"])) == GOLDEN_HASHES["apple bytes"]


def test_golden_multi_column_and_reducers() -> None:
    batch = pa.record_batch({"s": ["apple"], "i": pa.array([5], pa.int32())})
    assert hash_keys(batch, ["s", "i"])[0].as_py() == 0xCFF54D908A83073D
    assert hash_partition(batch, ["s"], 16).to_pylist() == [8]
    keys = pa.record_batch({"k": pa.array(range(10), pa.int64())})
    assert hash_partition(keys, ["k"], 4).to_pylist() == GOLDEN_REDUCERS_0_TO_9_OF_4
    # The documented reduction: reducer = (hash * n) >> 64.
    hashes = hash_keys(keys, ["k"]).to_pylist()
    assert [(h * 4) >> 64 for h in hashes] == GOLDEN_REDUCERS_0_TO_9_OF_4


GOLDEN_REDUCERS_0_TO_9_OF_4 = [0, 2, 0, 3, 0, 3, 0, 2, 3, 1]


@pytest.mark.parametrize(
    "type_",
    [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()],
)
def test_every_integer_width_agrees_by_value(type_: pa.DataType) -> None:
    values = [0, 1, 5, 100, None]
    expected = hash_keys(pa.record_batch({"k": pa.array(values, pa.int64())}), ["k"])
    assert hash_keys(pa.record_batch({"k": pa.array(values, type_)}), ["k"]).equals(expected)


@pytest.mark.parametrize(
    "array",
    [
        pa.array(["a", None, "apple", ""], pa.large_string()),
        pa.array(["a", None, "apple", ""], pa.string_view()),
        pa.array(["a", None, "apple", ""]).dictionary_encode(),
        pa.DictionaryArray.from_arrays(pa.array([0, None, 1, 2], pa.int8()), ["a", "apple", ""]),
    ],
)
def test_string_types_and_dictionaries_agree(array: pa.Array) -> None:
    expected = hash_keys(pa.record_batch({"k": pa.array(["a", None, "apple", ""])}), ["k"])
    assert hash_keys(pa.record_batch({"k": array}), ["k"]).equals(expected)


def test_binary_types_agree() -> None:
    values = [b"a", None, b"\x00\xff"]
    expected = hash_keys(pa.record_batch({"k": pa.array(values, pa.binary())}), ["k"])
    for type_ in (pa.large_binary(),):
        assert hash_keys(pa.record_batch({"k": pa.array(values, type_)}), ["k"]).equals(expected)


def test_partition_is_int32_in_range() -> None:
    batch = pa.record_batch({"k": pa.array(range(10_000), pa.int64())})
    out = hash_partition(batch, ["k"], 7)
    assert out.type == pa.int32()
    assert set(out.to_pylist()) == set(range(7))


def test_errors_name_the_problem() -> None:
    batch = pa.record_batch({"f": [1.5]})
    with pytest.raises(MillstreamError, match=r'key column "f" has type Float64'):
        hash_partition(batch, ["f"], 2)
    with pytest.raises(
        MillstreamError, match=r'key column "x" is not in the batch; its columns are \["f"\]'
    ):
        hash_partition(batch, ["x"], 2)
    with pytest.raises(MillstreamError, match="num_reducers"):
        hash_partition(batch, ["f"], 0)
    with pytest.raises(MillstreamError, match="at least one key column"):
        hash_partition(batch, [], 2)
