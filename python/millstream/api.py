"""What users write: a :class:`Mapper`, a :class:`Reducer`, and what they exchange.

A mapper turns a batch of input rows into a :class:`Partitioned` batch (rows plus one reducer
index per row). A reducer receives every row sent to it and writes its effect through a
:class:`Transaction` that millstream commits together with its own bookkeeping, so each
row's effect is applied exactly once.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from millstream.exceptions import ConfigurationError
from millstream.key_groups import DEFAULT_KEY_GROUPS, key_group_range, route_by_hash
from millstream.ledger import OUTPUT
from millstream.state import StoreTransaction, decode_int64, decode_int64s

if TYPE_CHECKING:
    from millstream.inputs.store_queue import StoreQueue
    from millstream.outputs import ParquetSink, StagedOutputs

Key = tuple[Any, ...]


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is, passed to the user's mapper and reducer (thesis 4.5).

    Attributes:
        processor: The processor's name (its store prefix).
        role: ``"mapper"`` or ``"reducer"``.
        index: A reducer's index; a mapper's is the input partition it maps (a mapper
            worker reading several partitions runs one ``Mapper`` per partition).
        guid: This instance's GUID; a restarted worker gets a new one.
        num_mappers: Number of mapper workers.
        num_reducers: Number of reducers.
        processor_guid: The processor's GUID: stable for a given store and name, so the
            same across restarts and runners.
        num_partitions: Number of input partitions, each a stream of shuffled rows of its
            own (reducers see rows per partition); 0 when built by hand: ``num_mappers``.
        key_groups: Keys hash to this many key groups, fixed when the processor is
            created (the most reducers it can be rescaled to); reducer ``r`` owns the
            contiguous :attr:`key_group_range`. 0 when built by hand: the default, 128.
    """

    processor: str
    role: str
    index: int
    guid: str
    num_mappers: int
    num_reducers: int
    processor_guid: str = ""
    num_partitions: int = 0
    key_groups: int = 0

    def __post_init__(self) -> None:
        if self.num_partitions == 0:
            object.__setattr__(self, "num_partitions", self.num_mappers)
        if self.key_groups == 0:
            object.__setattr__(self, "key_groups", DEFAULT_KEY_GROUPS)

    @property
    def key_group_range(self) -> range:
        """The key groups reducer :attr:`index` owns (:meth:`Partitioned.by_hash` sends it
        exactly the keys hashing into them); rescaling reassigns whole ranges."""
        return key_group_range(self.index, self.num_reducers, self.key_groups)


@dataclass(frozen=True)
class Partitioned:
    """Mapped rows, each tagged with the reducer it goes to.

    Attributes:
        batch: The mapped rows; any schema, which may change from batch to batch by the
            safe changes of :mod:`millstream.schema_unification` (the window carries
            their unified schema).
        reducer_indices: One reducer index per row (int32), in ``[0, num_reducers)``.
    """

    batch: pa.RecordBatch
    reducer_indices: pa.Array

    def __post_init__(self) -> None:
        if len(self.reducer_indices) != self.batch.num_rows:
            raise ValueError(
                f"Partitioned got {self.batch.num_rows} rows but {len(self.reducer_indices)} "
                "reducer indices; give exactly one reducer index per row"
            )

    @classmethod
    def by_hash(
        cls,
        batch: pa.RecordBatch | pa.Table,
        key: str | Sequence[str],
        num_reducers: int,
        *,
        canonical_order: bool = True,
        key_groups: int = DEFAULT_KEY_GROUPS,
    ) -> Partitioned:
        """Send each row to the reducer chosen by a stable hash of its key columns.

        The hash is fixed and documented (the same in every process, machine and release),
        so equal keys always reach the same reducer. A key hashes to one of ``key_groups``
        key groups, and each reducer owns a contiguous range of them
        (:attr:`WorkerSpec.key_group_range`); a processor created with other
        ``key_groups`` passes ``key_groups=self.spec.key_groups``.

        With ``canonical_order`` (the default) the rows are put in the order of their key
        hashes, rows with equal keys in the order ``map`` gave them. When the keys are
        unique within the batch, as after a pre-aggregation, the result then depends only
        on which rows ``map`` produced, not on their order: a ``map`` built on operations
        whose output order is unspecified (pyarrow's multi-threaded ``group_by``, iterating
        a ``set``) still maps a batch to the same rows at the same shuffle indices after a
        restart, as exactly-once requires. It costs a linear-time radix sort and a copy of
        the batch (about 25 ns per row); turn it off when ``map``'s order is already
        deterministic and the rows are many.
        """
        batch = _as_batch(batch)
        keys = [key] if isinstance(key, str) else list(key)
        if not 1 <= num_reducers <= key_groups:
            raise ConfigurationError(
                f"by_hash: num_reducers must be between 1 and key_groups ({key_groups}), "
                f"got {num_reducers}; create the processor with more key groups"
            )
        batch, indices = route_by_hash(
            batch, keys, num_reducers, key_groups, canonical_order=canonical_order
        )
        return cls(batch, indices)

    @classmethod
    def to_reducer(cls, batch: pa.RecordBatch | pa.Table, reducer_index: int) -> Partitioned:
        """Send every row of ``batch`` to one reducer."""
        batch = _as_batch(batch)
        return cls(batch, pa.repeat(pa.scalar(reducer_index, pa.int32()), batch.num_rows))

    @classmethod
    def with_indices(
        cls, batch: pa.RecordBatch | pa.Table, reducer_indices: pa.Array | Sequence[int]
    ) -> Partitioned:
        """Rows with explicit reducer indices chosen by the mapper."""
        array = (
            reducer_indices
            if isinstance(reducer_indices, pa.Array)
            else pa.array(reducer_indices, type=pa.int32())
        )
        return cls(_as_batch(batch), array)


def _as_batch(data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    if isinstance(data, pa.Table):
        return (
            data.combine_chunks().to_batches()[0]
            if data.num_rows
            else pa.RecordBatch.from_pylist([], schema=data.schema)
        )
    return data


class Transaction:
    """The reducer's view of the store transaction committed with its bookkeeping.

    Keys are tuples under the processor's output keyspace. Values are bytes; counters
    written with :meth:`add` are little-endian int64 (read them with :meth:`get_int`), and a
    key's several counters added together by :meth:`add_many` are int64 lanes of one value
    (read them with :meth:`get_ints`). The batch operations take Arrow arrays and avoid a Python
    loop per key: use them on hot paths.
    Everything written here commits atomically with the reducer's committed indices, or not
    at all. FoundationDB's limits apply (10 MB of writes, 100 kB values, 10 kB keys, 5 s).

    Rows for the processor's declared ``outputs`` go through :meth:`append` (a store queue
    another processor reads: a pipeline) and :meth:`write_parquet` (a file sink); they
    commit with the rest or not at all.
    """

    def __init__(self, txn: StoreTransaction, outputs: StagedOutputs | None = None) -> None:
        self._txn = txn
        self._outputs = outputs

    @staticmethod
    def _key(key: Key) -> Key:
        return (*OUTPUT, *key)

    def get(self, key: Key) -> bytes | None:
        """The value at ``key``, or None."""
        return self._txn.get(self._key(key))

    def get_int(self, key: Key) -> int:
        """The int64 counter at ``key`` (0 when absent)."""
        raw = self._txn.get(self._key(key))
        return 0 if raw is None else decode_int64(raw)

    def set(self, key: Key, value: bytes) -> None:
        """Write ``value`` at ``key``."""
        self._txn.set(self._key(key), value)

    def clear(self, key: Key) -> None:
        """Delete ``key``."""
        self._txn.clear(self._key(key))

    def add(self, key: Key, delta: int) -> None:
        """Atomically add ``delta`` to the int64 counter at ``key``."""
        self._txn.add(self._key(key), delta)

    def clear_prefix(self, prefix: Key) -> None:
        """Delete every key that starts with ``prefix`` (not ``prefix`` itself)."""
        self._txn.clear_range_startswith(self._key(prefix))

    def get_range(self, prefix: Key, *, limit: int = 0) -> list[tuple[Key, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``, in key order."""
        rows = self._txn.get_range_startswith(self._key(prefix), limit=limit)
        return [(key[len(OUTPUT) :], value) for key, value in rows]

    def get_ints(self, key: Key, width: int) -> tuple[int, ...]:
        """The ``width`` int64 counters at ``key`` kept by :meth:`add_many` with several
        columns (zeros when absent)."""
        return decode_int64s(self._txn.get(self._key(key)), width)

    def add_many(
        self, keyspace: Key, keys: pa.Array, deltas: pa.Array | pa.RecordBatch | pa.Table
    ) -> None:
        """Add ``deltas[i]`` to the counter at ``keyspace + (keys[i],)`` for every i.

        Several counters per key (a sum and a count, say) go in one call as int columns:
        ``deltas`` a ``RecordBatch`` or ``Table``. The key then holds one value with every
        counter (read it with :meth:`get_ints`), one stored entry instead of one per
        counter: a commit writes a fraction of the bytes.
        """
        self._txn.add_many(self._key(keyspace), keys, deltas)

    def set_many(self, keyspace: Key, keys: pa.Array, values: pa.Array) -> None:
        """Write ``values[i]`` at ``keyspace + (keys[i],)`` for every i."""
        self._txn.set_many(self._key(keyspace), keys, values)

    def get_many(self, keyspace: Key, keys: pa.Array) -> list[bytes | None]:
        """The values at ``keyspace + (keys[i],)``."""
        return self._txn.get_many(self._key(keyspace), keys)

    @property
    def write_size(self) -> int:
        """Bytes written so far in this transaction (all of it, bookkeeping included)."""
        return self._txn.write_size

    def _staged(self) -> StagedOutputs:
        if self._outputs is None:
            raise ConfigurationError(
                "this transaction has no outputs: append and write_parquet work inside a "
                "reducer's reduce, for outputs declared in Processor(outputs=[...])"
            )
        return self._outputs

    def append(
        self,
        queue: StoreQueue | str,
        rows: pa.RecordBatch | pa.Table,
        *,
        partition: int | None = None,
    ) -> None:
        """Append ``rows`` to an output queue when (and only if) this transaction commits.

        A processor that reads the queue then consumes every row exactly once: a pipeline of
        processors. The rows go into this transaction, so they count against its size limit
        (the reducer fetches fewer rows next time when a commit grows too large).

        Args:
            queue: A :class:`~millstream.inputs.StoreQueue` of the processor's ``outputs``, or
                its name.
            rows: The rows; appends to a queue partition may change its schema only by
                the safe changes of :mod:`millstream.schema_unification`.
            partition: The queue partition; default: the reducer's index modulo the queue's
                partitions. Reducers appending to one partition conflict with each other's
                commits (they retry, but slower): give the queue one partition per reducer.
        """
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        self._staged().append(queue, table, partition)

    def emit(self, output: str, rows: pa.RecordBatch | pa.Table) -> None:
        """Send ``rows`` to the processor output named ``output``, whatever its kind: a
        queue's :meth:`append` (default partition) or a sink's :meth:`write_parquet`."""
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        self._staged().emit(output, table)

    def write_parquet(self, sink: ParquetSink | str, rows: pa.RecordBatch | pa.Table) -> None:
        """Publish ``rows`` as a Parquet file of ``sink`` when (and only if) this commits.

        The file is written after ``reduce`` returns, recorded in this transaction and
        renamed into the sink's directory after the commit; see
        :class:`~millstream.outputs.ParquetSink`. One file per call: write once per
        ``reduce`` with all of its rows.

        Args:
            sink: A :class:`~millstream.outputs.ParquetSink` of the processor's ``outputs``,
                or its name.
            rows: The rows of the file.
        """
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
        self._staged().write_parquet(sink, table)


class Mapper(ABC):
    """Base class of the user's mapper. One instance per input partition (a mapper worker
    reading several partitions runs one for each).

    ``map`` **must be deterministic**: the same input batch must give the same output rows,
    in the same order, with the same reducer indices, in every process and after every
    restart. millstream re-maps input after failures and relies on this for exactly-once;
    it cannot check it. A mapper may combine rows of one batch (pre-aggregate) before the
    shuffle. :meth:`Partitioned.by_hash` puts rows with distinct keys in a canonical order,
    so the order of a pre-aggregated batch cannot break this; with other constructors,
    watch for operations whose output order is unspecified: pyarrow's ``Table.group_by``
    guarantees no order unless called with ``use_threads=False`` (which is also faster in a
    worker: one process per core), and Python's ``hash`` of strings changes between
    processes.

    Attributes:
        spec: This worker's :class:`WorkerSpec`.
        config: The user configuration given to the processor.
    """

    def __init__(self, spec: WorkerSpec, config: Mapping[str, Any]) -> None:
        self.spec = spec
        self.config = config

    @abstractmethod
    def map(self, batch: pa.RecordBatch) -> Partitioned:
        """Map one input batch to rows tagged with reducer indices."""


class Reducer(ABC):
    """Base class of the user's reducer. One instance per reducer worker.

    Attributes:
        spec: This worker's :class:`WorkerSpec`.
        config: The user configuration given to the processor.
        drained_partitions: Input partitions whose input ended and whose every row every
            reducer has committed, as of this reducer's last look at the store (set before
            each ``reduce``): nothing more will come from them.
    """

    def __init__(self, spec: WorkerSpec, config: Mapping[str, Any]) -> None:
        self.spec = spec
        self.config = config
        self.drained_partitions: frozenset[int] = frozenset()

    @property
    def drained_mappers(self) -> frozenset[int]:
        """Deprecated: :attr:`drained_partitions` (it holds input partitions)."""
        warnings.warn(
            "Reducer.drained_mappers is deprecated: use Reducer.drained_partitions",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.drained_partitions

    @drained_mappers.setter
    def drained_mappers(self, partitions: frozenset[int]) -> None:
        self.drained_partitions = partitions

    @abstractmethod
    def reduce(self, batch: pa.RecordBatch, txn: Transaction) -> None:
        """Apply the effect of ``batch`` through ``txn``.

        ``batch`` holds rows from every mapper that had rows for this reducer. If ``reduce``
        raises, nothing of this batch is committed and the worker stops with the rows'
        ranges in the error. Effects outside ``txn`` are not covered by exactly-once.
        """

    def drain(self, txn: Transaction) -> None:  # noqa: B027 (optional hook)
        """Called once when the processor drained (every partition's input ended and every row
        is committed), in a transaction of its own: flush what ``reduce`` kept pending,
        such as event-time panes the end of input closes.

        Its writes commit exactly once, with a marker millstream keeps; a reducer restarted
        after the commit does not call it again. Output queues are sealed only after every
        reducer's ``drain`` committed.
        """

    @classmethod  # noqa: B027 (optional hook; the default does nothing)
    def on_rescale(cls, txn: Transaction, old_reducers: int, new_reducers: int) -> None:
        """Called once when :func:`millstream.rescale` hands the processor from
        ``old_reducers`` to ``new_reducers`` reducers, inside the transaction that hands
        over (it commits with the new key-group ranges or not at all), after every old
        reducer committed every row up to the same point.

        Move here what the reducer keeps under its own index (``spec.index``) rather than
        by key: reducer ``r``'s records to the new indices. State kept by key (written with
        :meth:`Transaction.add_many` or :meth:`Transaction.set_many`, or under the key's
        key group) needs nothing: the new owner of a key group finds it where it is.
        """

    def timer_due(self) -> bool:
        """Whether the reducer has something to do because time passed, though no rows
        came: asked after each round that fetched none (the loop's waits between rounds
        pace the asking). False by default. For output that depends on the clock as well
        as on rows, such as event-time panes whose idle partitions stop holding the
        watermark after a timeout. Return quickly."""
        return False

    def on_timer(self, txn: Transaction) -> None:  # noqa: B027 (optional hook)
        """Called when :meth:`timer_due` says so, in a transaction that commits what it
        writes with the reducer's unchanged committed indices (nothing written: nothing
        committed). A :class:`~millstream.QueueReducer`'s ``process`` is called instead,
        over its pending rows. Like :meth:`reduce`: if it raises, nothing of it is
        committed."""

    def figures(self) -> Mapping[str, int | float]:
        """Figures of the reducer's own for its status (``millstream status``, the
        metrics), by name, such as the event-time panes' ``late_rows``. Called from the
        worker's heartbeat thread: return quickly, what the last commits settled. None by
        default."""
        return {}

    def on_commit(self) -> None:  # noqa: B027 (optional hook; the default does nothing)
        """Called after the transaction of the last :meth:`reduce` committed: as soon as it
        did, before the reducer tells the mappers of the commit.

        For effects that must follow the commit: metrics, latency measurement, notifying
        a consumer that new results are readable. Not called when the commit failed or was
        abandoned (the same rows will be reduced again), nor when its outcome is unknown
        and the commit turns out to have been applied: it can be missed, never doubled. An
        exception raised here is logged and does not stop the worker.
        """


def __getattr__(name: str) -> Any:
    """``millstream.api.Tuning``: a deprecated path of :class:`millstream.Tuning`."""
    if name == "Tuning":
        import warnings

        from millstream.tuning import Tuning

        warnings.warn(
            "millstream.api.Tuning moved: use millstream.Tuning (or millstream.tuning.Tuning)",
            DeprecationWarning,
            stacklevel=2,
        )
        return Tuning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Mapper", "Partitioned", "Reducer", "Transaction", "WorkerSpec"]
