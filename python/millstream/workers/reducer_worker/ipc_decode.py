"""IPC decode: the mappers' Arrow IPC answers as one batch for ``reduce``."""

from __future__ import annotations

import pyarrow as pa

from millstream import _core
from millstream.exceptions import MillstreamError, SchemaEvolutionError, UserCodeError
from millstream.schema_unification import concat


def decode_rows(reducer_index: int, payloads: list[bytes], senders: list[int]) -> pa.RecordBatch:
    """One batch from every mapper's rows; differing schemas are unified if they can be
    (:func:`millstream.schema_unification.unify`).

    Raises:
        UserCodeError: The mappers' schemas cannot be unified (say which and how).
    """
    try:
        return _core.decode_ipc(payloads)
    except MillstreamError:
        if len(payloads) < 2:
            raise
    parts = [_core.decode_ipc([payload]) for payload in payloads]
    try:
        return concat([part for part in parts if part.num_columns] or parts[:1])
    except SchemaEvolutionError as exc:
        described = "; ".join(
            f"mapper {m}: {part.schema.to_string(show_schema_metadata=False)}".replace("\n", ", ")
            for m, part in zip(senders, parts, strict=True)
        )
        raise UserCodeError(
            f"reducer {reducer_index} received rows with incompatible schemas ({exc}): "
            f"{described}. Every mapper's map must return columns of compatible types "
            "(the same names; types that widen into one: see millstream.schema_unification)"
        ) from exc
