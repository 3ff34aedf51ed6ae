"""Tuple keys in the FoundationDB tuple-layer encoding, shared by every backend.

The encoding comes from ``fdb.tuple`` (the official binding). That module packs and unpacks
without ``libfdb_c`` and without ``fdb.api_version`` being called: it only consults the
selected API version for behaviour older than 520, which millstream never selects. This
module is the one place that imports it, so the rest of the package never depends on the
API-version dance.

Packed keys compare bytewise in the same order as their tuples, and ``pack(a + b) ==
pack(a) + pack(b)``, which the batch encoders below rely on.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias, overload

import fdb.tuple as _fdb_tuple
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from millstream.exceptions import ConfigurationError

Key: TypeAlias = tuple[Any, ...]
"""A state store key: a tuple of ints, strings, bytes, floats, bools, None or nested tuples."""

_INT64 = struct.Struct("<q")
_UINT64_MOD = 1 << 64
_UINT64_MAX = _UINT64_MOD - 1  # fdb.tuple switches to its arbitrary-size code here


def pack(key: Key) -> bytes:
    """Encode a tuple key (no prefix).

    Raises:
        TypeError: ``key`` is not a tuple or holds a type the tuple layer cannot encode.
    """
    if not isinstance(key, tuple):
        raise TypeError(
            f"state store keys are tuples, e.g. ('counts', word); got {type(key).__name__}"
        )
    try:
        # Integers, strings and bytes (exactly these types: a bool is not an int here)
        # without the tuple layer's generic encoder, which costs microseconds per key.
        return b"".join([_ENCODERS[type(element)](element) for element in key])
    except KeyError:
        packed: bytes = _fdb_tuple.pack(key)
        return packed


def unpack(data: bytes) -> Key:
    """Decode bytes produced by :func:`pack`."""
    key: Key = _fdb_tuple.unpack(data)
    return key


def range_of(prefix: Key) -> tuple[bytes, bytes]:
    """Packed bounds of every key strictly below ``prefix`` (its children, not itself)."""
    raw = pack(prefix)
    return raw + b"\x00", raw + b"\xff"


def strinc(key: bytes) -> bytes:
    """The first byte string greater than every string starting with ``key``."""
    stripped = key.rstrip(b"\xff")
    if not stripped:
        raise ValueError("a key range needs a byte other than 0xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def encode_int64(value: int) -> bytes:
    """Encode an int as the 8-byte little-endian value atomic add works on."""
    return _INT64.pack(value)


def decode_int64(value: bytes) -> int:
    """Decode a value written by atomic add: little-endian, two's complement.

    Values shorter than 8 bytes are zero-extended and longer ones truncated, as FoundationDB's
    ``ADD`` treats them.
    """
    if len(value) != 8:
        value = value[:8].ljust(8, b"\x00")
    result: int = _INT64.unpack(value)[0]
    return result


def encode_int64s(values: Sequence[int]) -> bytes:
    """Encode several counters as one value: little-endian int64s back to back (lanes)."""
    return struct.pack(f"<{len(values)}q", *(wrap_int64(int(v)) for v in values))


SLOT_BYTES = 16
"""Bytes a counter lane takes in a value FoundationDB's backend added lanes to: the int64,
then 8 bytes that take its carries (``rust/millstream-core/src/lanes.rs``: one atomic
``ADD`` adds every lane of a key without reading it). One byte follows the slots, so such a
value's length is odd and it is never mistaken for plain int64s."""


def int64_lanes(value: bytes) -> int:
    """How many counters a value written by a vector add holds, on either backend."""
    if len(value) % 8 == 1:
        return len(value) // SLOT_BYTES
    return len(value) // 8


def decode_int64s(value: bytes | None, width: int) -> tuple[int, ...]:
    """Decode ``width`` counters from a value written by a vector add (zeros when absent).

    Reads both layouts: int64s back to back (SQLite) and one 16-byte slot per counter plus
    a byte (FoundationDB, :data:`SLOT_BYTES`). A value of another width is cut or
    zero-extended to ``width`` lanes, as a vector add of that width would treat it.
    """
    raw = value or b""
    if len(raw) % 8 == 1:
        raw = b"".join(raw[i : i + 8] for i in range(0, len(raw) - 1, SLOT_BYTES))
    raw = raw[: 8 * width].ljust(8 * width, b"\x00")
    return struct.unpack(f"<{width}q", raw)


def add_int64s(base: bytes | None, delta: bytes) -> bytes:
    """``base`` plus ``delta`` lane by lane (each lane an int64 wrapping around in 64 bits).

    The result has ``delta``'s width: a shorter ``base`` (or none) is zero-extended and a
    longer one cut, the rule FoundationDB's ``ADD`` applies to the whole value. One lane is
    exactly :func:`encode_int64` of the atomic-add sum.
    """
    width = len(delta) // 8
    lanes = struct.Struct(f"<{width}Q")
    raw = (base or b"")[: len(delta)].ljust(len(delta), b"\x00")
    return lanes.pack(
        *(
            (a + b) & _UINT64_MAX
            for a, b in zip(lanes.unpack(raw), lanes.unpack(delta), strict=True)
        )
    )


def fold_int64s(keys: Sequence[bytes], deltas: Sequence[bytes]) -> dict[bytes, bytes]:
    """Each key's lane deltas added together, for a batch in which keys may repeat."""
    folded: dict[bytes, bytes] = {}
    for key, delta in zip(keys, deltas, strict=True):
        previous = folded.get(key)
        folded[key] = delta if previous is None else add_int64s(previous, delta)
    return folded


def wrap_int64(value: int) -> int:
    """Wrap an int into the signed 64-bit range (two's complement overflow)."""
    value %= _UINT64_MOD
    return value - _UINT64_MOD if value >= 1 << 63 else value


def _encode_int(n: int) -> bytes:
    if n == 0:
        return b"\x14"
    if n >= _UINT64_MAX or -n >= _UINT64_MAX:
        return _fdb_tuple.pack((n,))  # type: ignore[no-any-return]
    if n > 0:
        length = (n.bit_length() + 7) >> 3
        return bytes((0x14 + length,)) + n.to_bytes(length, "big")
    length = ((-n).bit_length() + 7) >> 3
    return bytes((0x14 - length,)) + (n + (1 << (length << 3)) - 1).to_bytes(length, "big")


_BYTE_LIMITS = np.array([1 << (8 * k) for k in range(8)], dtype=np.uint64)


def _encode_int_array(base: bytes, keys: pa.Array) -> Sequence[bytes]:
    """:func:`_encode_int` for every element of an integer array, in numpy (as
    :class:`EncodedKeys`, which makes Python bytes only if asked).

    The tuple layer writes an integer as a type code ``0x14 ± L`` followed by its magnitude
    in ``L`` big-endian bytes (one's complement for negatives), ``L`` the fewest bytes that
    hold it. Every 64-bit integer but 2**64 - 1 fits that form.
    """
    n = len(keys)
    if n == 0:
        return []
    if pa.types.is_unsigned_integer(keys.type):
        magnitude = keys.cast(pa.uint64()).to_numpy(zero_copy_only=False)
        if (magnitude == np.uint64(_UINT64_MAX)).any():  # needs the arbitrary-size code
            return [base + _encode_int(v) for v in magnitude.tolist()]
        negative = np.zeros(n, dtype=bool)
    else:
        signed = keys.cast(pa.int64()).to_numpy(zero_copy_only=False)
        negative = signed < 0
        raw = signed.view(np.uint64)
        magnitude = np.where(negative, ~raw + np.uint64(1), raw)  # |x|, also for -2**63
    length = (magnitude[:, None] >= _BYTE_LIMITS[None, :]).sum(axis=1)  # 0 for zero
    mask = np.where(
        length == 8, np.uint64(_UINT64_MAX), (np.uint64(1) << (8 * length).astype(np.uint64)) - 1
    )
    body = np.where(negative, ~magnitude & mask, magnitude)
    code = np.where(negative, 0x14 - length, 0x14 + length).astype(np.uint8)
    width = len(base) + 9
    rows = np.empty((n, width), dtype=np.uint8)
    rows[:, : len(base)] = np.frombuffer(base, dtype=np.uint8)
    rows[:, len(base)] = code
    rows[:, len(base) + 1 :] = body.astype(">u8").view(np.uint8).reshape(n, 8)
    keep = np.ones((n, width), dtype=bool)
    keep[:, len(base) + 1 :] = np.arange(8)[None, :] >= (8 - length)[:, None]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(len(base) + 1 + length, out=offsets[1:])
    data = rows[keep]
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return EncodedKeys(array)


class EncodedKeys(Sequence[bytes]):
    """A batch's encoded keys as one Arrow binary array.

    A sequence of ``bytes`` like the list :func:`encode_keys` returns for other key
    types, but the Python objects are made only when something iterates or slices it: a
    backend that takes the array as it is (the SQLite store's delta runs) never pays for
    them.
    """

    def __init__(self, array: pa.Array) -> None:
        self.array = array
        self._list: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, int) and self._list is None:
            value: bytes = self.array[index].as_py()
            return value
        return self.as_list()[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.as_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedKeys):
            return self.as_list() == other.as_list()
        return isinstance(other, list) and self.as_list() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EncodedKeys({self.as_list()!r})"

    def as_list(self) -> list[bytes]:
        """The keys as Python bytes (made once)."""
        if self._list is None:
            self._list = self.array.to_pylist()
        return self._list

    def total_bytes(self) -> int:
        """The keys' lengths added up."""
        offsets = self.array.buffers()[1]
        width = 8 if pa.types.is_large_binary(self.array.type) else 4
        ends = np.frombuffer(offsets, dtype=np.int64 if width == 8 else np.int32)
        first, last = self.array.offset, self.array.offset + len(self.array)
        return int(ends[last] - ends[first])

    def longest(self) -> bytes:
        """The longest key (the first of them)."""
        lengths = pc.binary_length(self.array)
        value: bytes = self.array[pc.index(lengths, pc.max(lengths)).as_py()].as_py()
        return value

    def bounds(self) -> tuple[bytes, bytes]:
        """The least and the greatest key."""
        low, high = pc.min_max(self.array).values()
        return low.as_py(), high.as_py()


def key_bytes(keys: Sequence[bytes]) -> int:
    """The lengths of ``keys`` added up."""
    if isinstance(keys, EncodedKeys):
        return keys.total_bytes()
    return sum(map(len, keys))


def longest_key(keys: Sequence[bytes]) -> bytes:
    """The longest of ``keys`` (not empty)."""
    if isinstance(keys, EncodedKeys):
        return keys.longest()
    return max(keys, key=len)


def _encode_str(s: str) -> bytes:
    return b"\x02" + s.encode().replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_bytes(b: bytes) -> bytes:
    return b"\x01" + b.replace(b"\x00", b"\x00\xff") + b"\x00"


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    int: _encode_int,
    str: _encode_str,
    bytes: _encode_bytes,
}


def encode_keys(base: bytes, keys: pa.Array | pa.ChunkedArray | Sequence[Any]) -> Sequence[bytes]:
    """Encode ``base + pack((k,))`` for every element of an Arrow array (or sequence).

    Integers, strings and binaries take a tight specialised path that produces exactly the
    tuple-layer bytes; other types go through ``fdb.tuple.pack``.

    Raises:
        ConfigurationError: ``keys`` holds nulls (a key element cannot be missing).
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(keys, pa.Array):
        if keys.null_count:
            raise ConfigurationError(
                f"batch keys must not contain nulls; got {keys.null_count} null(s)"
            )
        kind = keys.type
        if pa.types.is_integer(kind):
            return _encode_int_array(base, keys)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return [base + _encode_str(v) for v in keys.to_pylist()]
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            return [base + _encode_bytes(v) for v in keys.to_pylist()]
        return [base + pack((v,)) for v in keys.to_pylist()]
    return [base + pack((v,)) for v in keys]
