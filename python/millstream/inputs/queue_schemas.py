"""A store queue partition's schemas over its rows: appends may evolve the schema by the
safe changes of :mod:`millstream.schema_unification`, and a read returns rows of one schema.

Records under the partition's key (beside those of :mod:`millstream.inputs.store_queue`):

- ``(p, "schema")``: the latest schema (IPC), of the rows from ``schema_from`` on (all
  rows while the schema never changed: the only record then, as before schemas evolved).
- ``(p, "schema_from")``: the row where the latest schema begins; absent if it never
  changed.
- ``(p, "schemas", row)``: an earlier schema, of the rows from ``row`` up to the next such
  record (or ``schema_from``); cleared once trimming passes it.
- ``(p, "unified")``: the unified schema of every append so far (absent: the latest),
  which the next append's schema must be a safe change of.

An append of the latest schema and a read past ``schema_from`` cost nothing more than
before: one comparison of the stored bytes, one key read with the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from millstream.exceptions import InputError, SchemaEvolutionError
from millstream.schema_unification import evolve
from millstream.state.keys import Key, decode_int64, encode_int64
from millstream.state.transaction import StoreTransaction


def _schema(raw: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(raw))


@dataclass(frozen=True)
class QueueSchemas:
    """The schema records of one queue partition.

    Args:
        key: The partition's key maker (``key(*rest)`` is ``(..., partition, *rest)``).
        where: The partition, as errors name it (``queue 'q' partition 0``).
    """

    key: Callable[..., Key]
    where: str

    def change(
        self, txn: StoreTransaction, latest: bytes, schema_ipc: bytes, row: int, appender: str
    ) -> None:
        """Record that the rows from ``row`` on have the schema ``schema_ipc``, unlike the
        latest one before (``latest``).

        Raises:
            InputError: The schema is not a safe change of the partition's unified schema:
                names the append, the row, the column and both types.
        """
        unified_raw = txn.get(self.key("unified"))
        unified = _schema(latest if unified_raw is None else unified_raw)
        try:
            evolved = evolve(unified, _schema(schema_ipc))
        except SchemaEvolutionError as exc:
            raise InputError(
                f"{self.where}: the {appender} at row {row} changes the schema unsafely: "
                f"{exc}. Nothing of it was appended; append rows of a safe change (see "
                "millstream.schema_unification: cast them) or use another queue"
            ) from exc
        raw_from = txn.get(self.key("schema_from"))
        txn.set(self.key("schemas", 0 if raw_from is None else decode_int64(raw_from)), latest)
        txn.set(self.key("schema"), schema_ipc)
        txn.set(self.key("schema_from"), encode_int64(row))
        if unified_raw is None or not evolved.equals(unified):
            txn.set(self.key("unified"), evolved.serialize().to_pybytes())

    def span(self, txn: StoreTransaction, row: int, stop: int) -> tuple[bytes, int]:
        """The stored schema of ``row`` (below ``schema_from``) and the end of its rows,
        at most ``stop``.

        Raises:
            InputError: No schema record covers ``row`` (trimmed concurrently or damaged).
        """
        covering = txn.get_range(
            self.key("schemas"), self.key("schemas", row + 1), limit=1, reverse=True, snapshot=True
        )
        if not covering:
            raise InputError(
                f"{self.where}: no schema is stored for row {row} (trimmed or damaged)"
            )
        after = txn.get_range(
            self.key("schemas", row + 1), self.key("schemas", stop), limit=1, snapshot=True
        )
        end = int(after[0][0][-1]) if after else stop
        return covering[0][1], min(end, stop)

    def trim(self, txn: StoreTransaction, row: int) -> None:
        """Clear the earlier schemas of rows that lie below ``row`` only."""
        raw_from = txn.get(self.key("schema_from"))
        if raw_from is None:
            return
        latest_from = decode_int64(raw_from)
        if row >= latest_from:
            txn.clear_range(self.key("schemas"), self.key("schemas", latest_from + 1))
            return
        covering = txn.get_range(
            self.key("schemas"), self.key("schemas", row + 1), limit=1, reverse=True
        )
        if covering:
            txn.clear_range(self.key("schemas"), covering[0][0])


__all__ = ["QueueSchemas"]
