"""What one ``reduce`` wrote to the processor's outputs, held until its transaction commits.

The reducer applies it after re-checking its own state in the transaction (so a
transaction that will not commit stages nothing), publishes the staged files once the
commit succeeded, and discards them when it failed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa

from millstream.exceptions import CommitUnknownResultError, ConfigurationError
from millstream.inputs.storable import check_storable
from millstream.inputs.store_queue import StoreQueue
from millstream.outputs.parquet_sink import ParquetSink, StagedFile
from millstream.state.transaction import StoreTransaction

log = logging.getLogger(__name__)

Output = StoreQueue | ParquetSink
"""Where a reducer's transaction may send rows: a store queue or a Parquet sink."""


def check_outputs(outputs: Sequence[Output], store_url: str) -> None:
    """Refuse outputs a processor on ``store_url`` cannot commit to.

    Raises:
        ConfigurationError: An output of another kind, in another store, or two outputs of
            one kind with one name.
    """
    seen: set[tuple[str, str]] = set()
    for output in outputs:
        if not isinstance(output, StoreQueue | ParquetSink):
            raise ConfigurationError(
                "outputs must be millstream.inputs.StoreQueue or millstream.outputs."
                f"ParquetSink objects; got {output!r}"
            )
        kind = type(output).__name__
        if output.store.url != store_url:
            raise ConfigurationError(
                f"{kind} {output.name!r} lives in store {output.store.url!r}, but the "
                f"processor's store is {store_url!r}: a reducer commits its outputs in its "
                "own transaction, so they must live in the same store"
            )
        if (kind, output.name) in seen:
            raise ConfigurationError(f"two outputs are the {kind} {output.name!r}")
        seen.add((kind, output.name))


def seal_queues(outputs: Sequence[Output]) -> None:
    """Seal every partition of every output queue: the processor drained, so no reducer
    appends again and a processor reading the queue drains too."""
    for output in outputs:
        if isinstance(output, StoreQueue):
            for partition in range(output.num_partitions):
                output.close_partition(partition)


def finish_publishing(outputs: Sequence[Output]) -> None:
    """Finish renames of files recorded by commits whose worker died before renaming."""
    for output in outputs:
        if isinstance(output, ParquetSink):
            moved = output.finish_publishing()
            if moved:
                log.info("sink %r: published %d file(s) a previous commit recorded", output, moved)


class StagedOutputs:
    """The rows one ``reduce`` sent to outputs: applied in its transaction, published after.

    Args:
        outputs: The processor's declared outputs.
        writer: Names the writer in file names, e.g. ``"reducer-0"``.
        default_partition: The queue partition rows go to when none is named (the
            reducer's index, modulo the queue's partitions: one writer per partition, so
            the reducers' commits do not conflict on the queue's end).
    """

    def __init__(self, outputs: Sequence[Output], writer: str, default_partition: int) -> None:
        self._outputs = outputs
        self._writer = writer
        self._default_partition = default_partition
        self._appends: list[tuple[StoreQueue, int, pa.Table]] = []
        self._files: list[tuple[ParquetSink, pa.Table]] = []
        self._staged: list[tuple[ParquetSink, StagedFile]] = []

    def _find(self, target: Output | str, kind: type[Output]) -> Output:
        name = target if isinstance(target, str) else target.name
        for output in self._outputs:
            if isinstance(output, kind) and output.name == name:
                return output
        declared = ", ".join(
            f"{type(o).__name__} {o.name!r}" for o in self._outputs if isinstance(o, kind)
        )
        raise ConfigurationError(
            f"{kind.__name__} {name!r} is not among the processor's outputs "
            f"({declared or 'none declared'}); declare it: Processor(..., outputs=[...])"
        )

    def append(self, queue: StoreQueue | str, rows: pa.Table, partition: int | None) -> None:
        """Hold rows for ``queue`` (see :meth:`~millstream.Transaction.append`)."""
        target = self._find(queue, StoreQueue)
        assert isinstance(target, StoreQueue)
        if partition is None:
            partition = self._default_partition % target.num_partitions
        elif not 0 <= partition < target.num_partitions:
            raise ValueError(
                f"partition {partition} out of range for queue {target.name!r} with "
                f"{target.num_partitions} partitions"
            )
        check_storable(rows.schema, target.name)
        if rows.num_rows:
            self._appends.append((target, partition, rows))

    def write_parquet(self, sink: ParquetSink | str, rows: pa.Table) -> None:
        """Hold rows for a file of ``sink`` (see :meth:`~millstream.Transaction.write_parquet`)."""
        target = self._find(sink, ParquetSink)
        assert isinstance(target, ParquetSink)
        if rows.num_rows:
            self._files.append((target, rows))

    def emit(self, name: str, rows: pa.Table) -> None:
        """Hold rows for the output named ``name``, a queue or a sink."""
        found = [output for output in self._outputs if output.name == name]
        if len(found) > 1:
            raise ConfigurationError(
                f"both a queue and a sink are named {name!r}: use append or write_parquet"
            )
        if not found:
            declared = ", ".join(f"{type(o).__name__} {o.name!r}" for o in self._outputs)
            raise ConfigurationError(
                f"no output is named {name!r} (declared: {declared or 'none'}); declare it: "
                "Processor(..., outputs=[...])"
            )
        if isinstance(found[0], StoreQueue):
            self.append(found[0], rows, None)
        else:
            self.write_parquet(found[0], rows)

    def apply(self, txn: StoreTransaction) -> None:
        """Append the queues' rows and stage and record the files, all in ``txn``."""
        for queue, partition, rows in self._appends:
            queue.append_in(txn.scoped(queue.store.prefix), partition, rows)
        for sink, rows in self._files:
            staged = sink.stage(rows, self._writer)
            self._staged.append((sink, staged))
            sink.record_in(txn.scoped(sink.store.prefix), staged)

    @contextlib.contextmanager
    def settled_with(self, txn: StoreTransaction) -> Iterator[None]:
        """Around a transaction that carries these outputs: if the block raises, reset
        ``txn`` and delete the staged files, unless the commit's outcome is unknown (their
        records may have landed: the reducer's next rounds, the next instance or a reader
        publish them, see :mod:`millstream.workers.reducer_worker.settling`)."""
        try:
            yield
        except CommitUnknownResultError:
            txn.reset()
            raise
        except BaseException:
            txn.reset()
            self.discard()
            raise

    def publish(self) -> None:
        """After the commit: move the staged files to their final names."""
        for sink, staged in self._staged:
            sink.publish(staged)

    def discard(self) -> None:
        """After a commit that did not happen: delete the staged files."""
        for sink, staged in self._staged:
            sink.discard(staged)
        self._staged.clear()

    def landed_in(self, txn: StoreTransaction) -> bool:
        """Whether the commit that recorded the staged files landed, as ``txn`` sees the
        store (the records commit together: the first one tells)."""
        for sink, staged in self._staged[:1]:
            return sink.is_recorded_in(txn.scoped(sink.store.prefix), staged)
        return False

    @property
    def empty(self) -> bool:
        """Whether nothing is held for any output (no queue rows, no file)."""
        return not self._appends and not self._files

    @property
    def rows_appended(self) -> int:
        """Rows held for queues."""
        return sum(rows.num_rows for _, _, rows in self._appends)

    @property
    def files_staged(self) -> int:
        """Files staged by :meth:`apply`."""
        return len(self._staged)
