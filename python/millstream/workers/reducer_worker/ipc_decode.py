"""IPC decode: the mappers' Arrow IPC answers as one batch for ``reduce``."""

from __future__ import annotations

import pyarrow as pa

from millstream import _core
from millstream.exceptions import MillstreamError, UserCodeError


def decode_rows(reducer_index: int, payloads: list[bytes], senders: list[int]) -> pa.RecordBatch:
    """One batch from every mapper's rows; differing schemas are unified if they can be.

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
        table = pa.concat_tables(
            [pa.Table.from_batches([part]) for part in parts], promote_options="permissive"
        )
    except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        described = "; ".join(
            f"mapper {m}: {part.schema.to_string(show_schema_metadata=False)}".replace("\n", ", ")
            for m, part in zip(senders, parts, strict=True)
        )
        raise UserCodeError(
            f"reducer {reducer_index} received rows with incompatible schemas ({exc}): "
            f"{described}. Every mapper's map must return columns of compatible types "
            "(the same names; types that widen to one, such as int64 and float64)"
        ) from exc
    return table.combine_chunks().to_batches()[0]
