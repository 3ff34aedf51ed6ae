"""Dead letters: rows whose ``map`` or ``reduce`` raised, kept in the store with the error
(``Tuning.on_user_error="dead_letter"``), and how many each worker set aside.

Records live under ``SYSTEM + ("dead-letter", ...)``, keyed by where the row was, so that
writing a row's record again writes the same key:

- ``("dead-letter", "map", partition, input row index)``: a row ``map`` raised on. The key
  is the row's input numbering, which every instance of the mapper shares (batch plans and
  a deterministic ``map``): a mapper that replays its input after a restart finds the same
  rows and rewrites the same keys, and :func:`record_dead_letters` counts only keys it did
  not find. Exactly once by construction, whenever the write commits (the worker writes
  them before the batch's good rows enter its window, so before its persisted input index
  can pass them).
- ``("dead-letter", "reduce", reducer, partition, first shuffle index, position)``: a row
  ``reduce`` raised on: the partition it came from, the first shuffle index of the
  reducer's fetch from that partition (its committed index then, plus one) and the row's
  position among that partition's rows in the fetch. Written in the transaction that
  commits the other rows' effects and the reducer's new committed indices, so the records
  land with them or not at all; a fetch's first shuffle index is never fetched from again
  once it commits, so no two commits share a key. A queue reducer's ``process`` (whose
  rows stay pending over rounds) keys a row by its own shuffle index, position 0, and
  writes it in the commit that finishes it: the same key however many rounds it waited.

A record holds the row itself (one-row Arrow IPC stream: every Arrow type the row has comes
back), the error's text, and the key's fields. The counters under ``("dead-letter-count",
stage, worker)`` (a mapper's partition, a reducer's index) grow only by records written
for the first time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from millstream.ledger.subspaces import SYSTEM, bad_record
from millstream.state.keys import Key, decode_int64, pack, unpack
from millstream.state.transaction import StoreTransaction

Stage = Literal["map", "reduce"]

ERROR_CHARS = 2_000
"""The longest error text a record keeps (the rest is cut: values stay small)."""


@dataclass(frozen=True)
class DeadLetter:
    """One row that ``map`` or ``reduce`` raised on, set aside instead of stopping the run.

    Attributes:
        stage: ``"map"`` or ``"reduce"``.
        partition: The input partition the row came from.
        index: ``map``: the row's input row index; ``reduce``: the first shuffle index of
            the reducer's fetch from ``partition`` that held the row (a queue reducer's
            ``process``: the row's shuffle index).
        position: ``reduce``: the row's position among ``partition``'s rows in that fetch
            (a queue reducer's ``process``: 0); ``map``: 0.
        reducer: ``reduce``: the reducer's index; ``map``: -1.
        error: What the user's code raised on the row alone (``repr`` of the exception).
        row: The row (a one-row batch, as ``map`` or ``reduce`` received it).
    """

    stage: Stage
    partition: int
    index: int
    position: int
    reducer: int
    error: str
    row: pa.RecordBatch

    @property
    def key(self) -> Key:
        """Where the record lives (see the module's description)."""
        if self.stage == "map":
            return (*SYSTEM, "dead-letter", "map", self.partition, self.index)
        return (
            *SYSTEM,
            "dead-letter",
            "reduce",
            self.reducer,
            self.partition,
            self.index,
            self.position,
        )

    @property
    def worker(self) -> int:
        """The worker whose counter counts it: a mapper's partition, a reducer's index."""
        return self.partition if self.stage == "map" else self.reducer


def encode_row(row: pa.RecordBatch) -> bytes:
    """The row as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, row.schema) as writer:
        writer.write_batch(row)
    return bytes(sink.getvalue())


def decode_row(data: bytes) -> pa.RecordBatch:
    """The row :func:`encode_row` wrote."""
    with pa.ipc.open_stream(data) as reader:
        return reader.read_next_batch()


def encode(letter: DeadLetter) -> bytes:
    """The stored value of a record."""
    return pack(
        (
            letter.stage,
            letter.partition,
            letter.index,
            letter.position,
            letter.reducer,
            letter.error[:ERROR_CHARS],
            encode_row(letter.row),
        )
    )


def decode(raw: bytes) -> DeadLetter:
    """A record from its stored value.

    Raises:
        StoreCorruptError: The value is not a dead-letter record.
    """
    try:
        stage, partition, index, position, reducer, error, row = unpack(raw)
        if stage not in ("map", "reduce"):
            raise ValueError(f"unknown stage {stage!r}")
        return DeadLetter(
            stage, int(partition), int(index), int(position), int(reducer), str(error),
            decode_row(bytes(row)),
        )  # fmt: skip
    except Exception as exc:
        raise bad_record("dead letter", raw, exc) from exc


def counter_key(stage: Stage, worker: int) -> Key:
    """Counter of the dead letters ``stage`` set aside on ``worker`` (partition or reducer)."""
    return (*SYSTEM, "dead-letter-count", stage, worker)


def record_dead_letters(txn: StoreTransaction, letters: list[DeadLetter]) -> int:
    """Write the records of ``letters`` that are not in the store yet, and count them.

    Returns:
        How many were new (a replay of a batch whose records landed: 0).
    """
    new = 0
    for letter in letters:
        if txn.get(letter.key) is not None:
            continue
        txn.set(letter.key, encode(letter))
        txn.add(counter_key(letter.stage, letter.worker), 1)
        new += 1
    return new


def dead_letter_counts(
    txn: StoreTransaction, *, snapshot: bool = True
) -> dict[tuple[str, int], int]:
    """Dead letters per ``(stage, worker)`` (read without conflicts unless ``snapshot`` is
    False)."""
    return {
        (str(key[-2]), int(key[-1])): decode_int64(value)
        for key, value in txn.get_range_startswith(
            (*SYSTEM, "dead-letter-count"), snapshot=snapshot
        )
    }


def read_dead_letters(
    txn: StoreTransaction, stage: Stage | None = None, *, limit: int = 0
) -> list[DeadLetter]:
    """The records, ``map``'s first, each stage's in key order (``limit``: at most that
    many; 0: all)."""
    prefix: Key = (*SYSTEM, "dead-letter") if stage is None else (*SYSTEM, "dead-letter", stage)
    return [decode(value) for _, value in txn.get_range_startswith(prefix, limit=limit)]


__all__ = [
    "DeadLetter",
    "Stage",
    "counter_key",
    "dead_letter_counts",
    "decode",
    "decode_row",
    "encode",
    "encode_row",
    "read_dead_letters",
    "record_dead_letters",
]
