"""DataFrame helpers: write a DataFrame into a store-backed queue, read reducer output back."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from millstream.exceptions import ConfigurationError, DuplicateSequenceError
from millstream.inputs.store_queue import StoreQueue
from millstream.ledger import OUTPUT
from millstream.state.keys import decode_int64s, int64_lanes

if TYPE_CHECKING:
    from millstream.processor import Processor

APPEND_BYTES = 4_000_000
"""Arrow bytes an executor gathers before one append (one store transaction)."""


def _appender(queue: StoreQueue, partition_by: str | None, write_id: str) -> Any:
    n = queue.num_partitions

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        spark_partition = ctx.partitionId() if ctx is not None else 0
        fixed = spark_partition % n
        # Every attempt of this task appends as the same producer, its k-th append to a
        # queue partition as sequence k: a retried attempt skips what an earlier one
        # appended.
        producer = queue.producer(f"spark-write-{write_id}-{spark_partition}")
        sequences: dict[int, int] = {}
        pending: dict[int, list[pa.RecordBatch]] = {}
        sizes: dict[int, int] = {}
        written = 0

        def flush(p: int) -> int:
            rows = pending.pop(p, [])
            sizes.pop(p, None)
            if not rows:
                return 0
            table = pa.Table.from_batches(rows)
            sequence = sequences.get(p, 0)
            sequences[p] = sequence + 1
            # Appended by an earlier attempt of this task: nothing to do.
            with contextlib.suppress(DuplicateSequenceError):
                producer.append(p, table, sequence=sequence)
            return int(table.num_rows)

        def add(p: int, batch: pa.RecordBatch) -> int:
            if not 0 <= p < n:
                raise ConfigurationError(
                    f"write_queue: column {partition_by!r} holds {p}, outside the queue's "
                    f"partitions [0, {n})"
                )
            pending.setdefault(p, []).append(batch)
            sizes[p] = sizes.get(p, 0) + batch.nbytes
            return flush(p) if sizes[p] >= APPEND_BYTES else 0

        for batch in batches:
            if batch.num_rows == 0:
                continue
            if partition_by is None:
                written += add(fixed, batch)
                continue
            column = batch.column(batch.schema.get_field_index(partition_by))
            if column.null_count:
                raise ConfigurationError(f"write_queue: column {partition_by!r} has nulls")
            for value in pc.unique(column).to_pylist():
                written += add(int(value), batch.filter(pc.equal(column, value)))
        for p in list(pending):
            written += flush(p)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([written], pa.int64())})

    return write


def write_queue(
    df: Any, queue: StoreQueue, *, partition_by: str | None = None, close: bool = False
) -> int:
    """Append a DataFrame's rows to a :class:`~millstream.inputs.StoreQueue` from the executors.

    Each Spark partition appends its rows as Arrow batches of a few MB, to queue partition
    ``spark_partition % queue.num_partitions``, or to the partition named by the integer
    column ``partition_by`` of each row. Appends from different Spark partitions interleave.

    Appending is exactly once when each Spark partition yields the same rows in the same
    order on a retry (a file source, a sorted DataFrame; not rows whose order depends on a
    shuffle): every attempt of one task appends as one :meth:`StoreQueue.producer`, its
    k-th append to a queue partition as sequence number k, so a retried or speculative
    attempt skips the appends an earlier one made, and an append whose commit outcome is
    unknown is retried without landing twice. Calling ``write_queue`` again writes the
    rows again.

    Args:
        df: The DataFrame; its Arrow schema becomes the queue partitions' schema.
        queue: The queue (it pickles: executors reopen its store from the URL, so use a store
            every executor reaches, e.g. FoundationDB, or SQLite on one machine).
        partition_by: Integer column in ``[0, queue.num_partitions)`` choosing the partition.
        close: Seal every partition afterwards, so mappers drain at the end of the rows.

    Returns:
        Rows appended.
    """
    if partition_by is not None and partition_by not in df.columns:
        raise ConfigurationError(f"write_queue: no column {partition_by!r} in {df.columns}")
    counts = df.mapInArrow(_appender(queue, partition_by, uuid.uuid4().hex), "rows long")
    written = sum(int(row["rows"]) for row in counts.collect())
    if close:
        for p in range(queue.num_partitions):
            queue.close_partition(p)
    return written


def _column_type(values: list[Any]) -> pa.DataType:
    sample = next((v for v in values if v is not None), None)
    if isinstance(sample, bool):
        return pa.bool_()
    if isinstance(sample, int):
        return pa.int64()
    if isinstance(sample, float):
        return pa.float64()
    if isinstance(sample, bytes):
        return pa.binary()
    return pa.string()


def output_table(
    processor: Processor,
    keyspace: Sequence[Any],
    *,
    key_names: Sequence[str] = ("key",),
    value_name: str | Sequence[str] = "value",
    decode: Literal["int64", "bytes"] = "int64",
    schema: pa.Schema | None = None,
) -> pa.Table:
    """A reducer output keyspace as an Arrow table (what :func:`read_output` wraps).

    Each key under ``("out", *keyspace)`` gives one row: its remaining tuple elements in the
    ``key_names`` columns, then the value (an int64 counter written with ``add``/``add_many``
    when ``decode="int64"``, else the raw bytes). Keys holding several counters (``add_many``
    of several columns) give one int64 column each: name them, in order, in ``value_name``.

    Raises:
        ConfigurationError: The keys have another number of elements than ``key_names``,
            or their values hold more counters than ``value_name`` names.
    """
    prefix = (*OUTPUT, *keyspace)
    store = processor.open_store()
    try:
        with store.read() as txn:
            pairs = txn.get_range_startswith(prefix, snapshot=True)
    finally:
        store.close()
    rows = [(key[len(prefix) :], value) for key, value in pairs]
    width = len(key_names)
    for key, _ in rows[:1]:
        if len(key) != width:
            raise ConfigurationError(
                f"keys under {tuple(keyspace)!r} have {len(key)} elements after the keyspace "
                f"but key_names names {width}: {list(key_names)}"
            )
    columns = {name: [key[i] for key, _ in rows] for i, name in enumerate(key_names)}
    names = [value_name] if isinstance(value_name, str) else list(value_name)
    values: dict[str, list[Any]]
    if decode == "int64":
        widest = max((int64_lanes(value) for _, value in rows), default=0)
        if widest > len(names):
            raise ConfigurationError(
                f"values under {tuple(keyspace)!r} hold up to {widest} counters (add_many of "
                f"several columns) but value_name names {len(names)}: {names}. Name each "
                "counter, in order: value_name=(...)"
            )
        lanes = [decode_int64s(value, len(names)) for _, value in rows]
        values = {name: [lane[i] for lane in lanes] for i, name in enumerate(names)}
        value_type = pa.int64()
    else:
        if len(names) != 1:
            raise ConfigurationError(
                f"decode='bytes' gives one value column; value_name names {len(names)}"
            )
        values = {names[0]: [value for _, value in rows]}
        value_type = pa.binary()
    if schema is not None:
        data = {**columns, **values}
        return pa.table({f.name: pa.array(data[f.name], f.type) for f in schema}, schema=schema)
    arrays = {name: pa.array(col, _column_type(col)) for name, col in columns.items()}
    arrays.update({name: pa.array(col, value_type) for name, col in values.items()})
    return pa.table(arrays)


def read_output(
    spark: Any,
    processor: Processor,
    keyspace: Sequence[Any],
    *,
    key_names: Sequence[str] = ("key",),
    value_name: str | Sequence[str] = "value",
    decode: Literal["int64", "bytes"] = "int64",
    schema: pa.Schema | None = None,
) -> Any:
    """A reducer output keyspace (``("out", *keyspace)``) as a Spark DataFrame.

    The driver reads the keyspace in one snapshot read (so the output must fit in the
    driver's memory, and within one transaction's limits on FoundationDB) and hands Spark
    an Arrow table; see :func:`output_table` for the columns.
    """
    table = output_table(
        processor,
        keyspace,
        key_names=key_names,
        value_name=value_name,
        decode=decode,
        schema=schema,
    )
    return spark.createDataFrame(table)


__all__ = ["output_table", "read_output", "write_queue"]
