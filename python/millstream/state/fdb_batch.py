"""FoundationDB's batch operations issued by the native core, one C call per key.

The official binding spends microseconds of Python per key and operation (its ``get``,
``set``, ``add`` and future wrappers, about 5 us per key and call): a reducer's
``add_many`` of 100,000 keys took a good part of a transaction's five seconds.
:class:`~millstream._core.FdbBatch` makes the same C calls from Rust with the GIL
released. It does not link ``libfdb_c`` (the package runs without it): it takes the
addresses of the functions the binding has loaded, with the API version it selected, and
each call is given the binding's transaction pointer. Errors come back as the binding's
``fdb.FDBError``, translated by the backend like every other.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from millstream._core import FdbBatch
from millstream.exceptions import StoreUnavailableError
from millstream.state.keys import EncodedKeys

C_FUNCTIONS = (
    "transaction_get",
    "transaction_set",
    "transaction_atomic_op",
    "future_block_until_ready",
    "future_get_value",
    "future_destroy",
)
"""The ``libfdb_c`` functions the batch operations call (without their ``fdb_`` prefix), as
:class:`~millstream._core.FdbBatch` takes their addresses."""


@functools.cache
def batch_operations(fdb: Any) -> FdbBatch:
    """The batch operations on the C functions of the ``libfdb_c`` that ``fdb`` (the
    binding, API version selected by :func:`~millstream.state.fdb_backend.load_fdb`) loaded.

    Raises:
        StoreUnavailableError: The binding does not expose its C library as the 7.3
            binding does (another binding than the one millstream pins).
    """
    try:
        capi = fdb.impl._capi
        addresses = {
            name: ctypes.cast(getattr(capi, f"fdb_{name}"), ctypes.c_void_p).value or 0
            for name in C_FUNCTIONS
        }
    except AttributeError as exc:
        from millstream.state.fdb_backend import BINDING_REQUIREMENT

        raise StoreUnavailableError(
            f"the installed FoundationDB binding does not expose libfdb_c as the 7.3 binding "
            f"does ({exc}); install the binding millstream pins: pip install "
            f"'{BINDING_REQUIREMENT}'"
        ) from exc
    return FdbBatch(**addresses, error=fdb.FDBError)


def binary_array(values: Sequence[bytes]) -> pa.Array:
    """``values`` as an Arrow binary array (the array itself for encoded keys)."""
    if isinstance(values, EncodedKeys):
        return values.array
    return pa.array(values, pa.large_binary())


def int64_bytes(values: Sequence[int]) -> bytes:
    """``values`` as little-endian int64s back to back."""
    return np.asarray(values, dtype="<i8").tobytes()


__all__ = ["batch_operations", "binary_array", "int64_bytes"]
