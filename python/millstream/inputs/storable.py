"""Which rows a store queue can keep: what it stores, every read must decode."""

from __future__ import annotations

import pyarrow as pa

from millstream.exceptions import InputError


def _has_dictionary(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return True
    return any(_has_dictionary(kind.field(i).type) for i in range(kind.num_fields))


def check_storable(schema: pa.Schema, name: str) -> None:
    """Refuse a schema whose rows the queue could store but not read back.

    Chunks are stored as IPC record-batch messages without dictionary batches, so a
    dictionary-encoded column (at any depth) would land and then fail every read.

    Raises:
        InputError: A column is dictionary-encoded.
    """
    for field in schema:
        if _has_dictionary(field.type):
            raise InputError(
                f"queue {name!r}: column {field.name!r} is {field.type}, and the queue "
                "stores rows without their dictionaries: decode it before appending "
                f"(batch.column({field.name!r}).dictionary_decode(), or cast it to its "
                "value type)"
            )


__all__ = ["check_storable"]
