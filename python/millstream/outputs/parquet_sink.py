"""An exactly-once Parquet file sink: files are published by the reducer's commit.

A reducer hands rows to :meth:`~millstream.Transaction.write_parquet`. Publishing takes
three steps, the pattern of two-phase-commit file sinks and table formats:

1. **stage**: after ``reduce``, the rows are written as a Parquet file under the sink
   directory's ``_staging/`` (readers of the directory skip names that begin with ``_``);
2. **record**: the file's name goes into the reducer's transaction, which commits it
   together with the reducer's committed indices, or not at all;
3. **publish**: after the commit, the staged file is renamed to its final name in the
   directory. A crash between commit and rename leaves a recorded file in ``_staging/``;
   the next reducer instance (and every :meth:`ParquetSink.files`) finishes the rename.
   After a commit whose outcome is unknown, the reducer renames the file on its next
   round once the store shows the record (or deletes it once it cannot land).

A file is published exactly when its record committed: a commit that failed or was
abandoned publishes nothing (its staged file is deleted), and a commit retried after an
unknown outcome records the same file, once. :meth:`ParquetSink.files` and
:meth:`ParquetSink.read` see recorded files only; a plain reader of the directory
(``pyarrow.dataset.dataset(directory)``) sees the published ones, which are the recorded
ones once pending renames finished. Staged files that were never recorded (a worker killed
between stage and commit) are removed by :meth:`ParquetSink.vacuum`.

Layout under ``SINKS + (name,)`` in the sink's store: ``("file", file_name)`` holds the
tuple-packed ``(rows, bytes)`` of each recorded file.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from millstream.exceptions import ConfigurationError
from millstream.ledger import SINKS
from millstream.state.keys import pack, unpack
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction
from millstream.state.url import open_store

STAGING = "_staging"
"""Subdirectory of staged files (a leading ``_``: directory readers skip it)."""


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file written under ``_staging/``, not yet recorded or published.

    Attributes:
        name: The file's name (the same staged and published).
        rows: Rows it holds.
        size: Its size in bytes.
    """

    name: str
    rows: int
    size: int


class ParquetSink:
    """A directory of Parquet files that reducers publish exactly once.

    Declare it in the processor's ``outputs`` and write to it from ``reduce`` with
    :meth:`~millstream.Transaction.write_parquet`. The object pickles (it reopens its store
    from the URL), so it travels to worker processes in the processor.

    Args:
        store: Store URL (opened here) or an open :class:`Store`; the processor writing
            to the sink must use the same store URL.
        name: The sink's name, unique within the store prefix.
        directory: Where files are published: a local path, or a URI ``pyarrow.fs``
            understands (a filesystem every worker shares). Renames must be atomic on it,
            as they are on local and HDFS filesystems.
        prefix: Store prefix when ``store`` is a URL.
    """

    def __init__(
        self,
        store: str | Store,
        name: str,
        directory: str,
        *,
        prefix: tuple[Any, ...] = (),
    ) -> None:
        if not name:
            raise ConfigurationError("a ParquetSink needs a non-empty name")
        self._store = open_store(store, prefix=prefix) if isinstance(store, str) else store
        self._name = name
        self._directory = str(directory)
        self._space = (*SINKS, name)
        self._fs, self._root = pafs.FileSystem.from_uri(_as_uri(self._directory))
        self._fs.create_dir(f"{self._root}/{STAGING}", recursive=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_fs"], state["_root"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fs, self._root = pafs.FileSystem.from_uri(_as_uri(self._directory))

    @property
    def store(self) -> Store:
        """The store holding the sink's records."""
        return self._store

    @property
    def name(self) -> str:
        """The sink's name."""
        return self._name

    @property
    def directory(self) -> str:
        """Where published files are."""
        return self._directory

    def _staged_path(self, name: str) -> str:
        return f"{self._root}/{STAGING}/{name}"

    def _final_path(self, name: str) -> str:
        return f"{self._root}/{name}"

    # -- the reducer's side: stage, record, publish -----------------------------------------

    def stage(self, table: pa.Table, writer: str) -> StagedFile:
        """Write ``table`` as a new file under ``_staging/`` (step 1).

        Args:
            table: The rows.
            writer: Names the writing worker in the file name, e.g. ``"reducer-0"``.
        """
        name = f"part-{writer}-{uuid.uuid4().hex}.parquet"
        path = self._staged_path(name)
        pq.write_table(table, path, filesystem=self._fs)
        size = self._fs.get_file_info(path).size or 0
        return StagedFile(name, table.num_rows, size)

    def record_in(self, txn: StoreTransaction, staged: StagedFile) -> None:
        """Record ``staged`` in the caller's transaction (step 2).

        ``txn`` must be a transaction on the sink's database seen under its prefix
        (``txn.scoped(sink.store.prefix)``).
        """
        txn.set((*self._space, "file", staged.name), pack((staged.rows, staged.size)))

    def is_recorded_in(self, txn: StoreTransaction, staged: StagedFile) -> bool:
        """Whether ``staged``'s record is in the store as ``txn`` sees it (scoped as for
        :meth:`record_in`): after a commit whose outcome is unknown, whether it landed."""
        return txn.get((*self._space, "file", staged.name), snapshot=True) is not None

    def publish(self, staged: StagedFile) -> None:
        """Move a recorded file to its final name (step 3); idempotent."""
        self._move(staged.name)

    def discard(self, staged: StagedFile) -> None:
        """Delete a staged file whose record can no longer commit."""
        self._delete(self._staged_path(staged.name))

    def _move(self, name: str) -> bool:
        """Rename staged ``name`` to its final path; False when it was not staged."""
        try:
            self._fs.move(self._staged_path(name), self._final_path(name))
        except FileNotFoundError:
            return False
        return True

    def _delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(path)

    # -- readers ----------------------------------------------------------------------------

    def recorded(self) -> dict[str, tuple[int, int]]:
        """Every recorded file's name with its ``(rows, bytes)``, in name order."""
        space = (*self._space, "file")
        rows = self._store.transact(
            lambda txn: txn.get_range_startswith(space, snapshot=True), idempotent=True
        )
        out: dict[str, tuple[int, int]] = {}
        for key, value in rows:
            count, size = unpack(value)
            out[str(key[-1])] = (int(count), int(size))
        return out

    def finish_publishing(self) -> int:
        """Rename every recorded file still under ``_staging/``; returns how many.

        A reducer instance calls it when it starts (its predecessor may have died between
        a commit and the rename); safe to run from several processes at once.
        """
        moved = 0
        for name in self.recorded():
            if not self._exists(self._final_path(name)):
                moved += self._move(name)
        return moved

    def _exists(self, path: str) -> bool:
        found: bool = self._fs.get_file_info(path).type != pafs.FileType.NotFound
        return found

    def files(self) -> list[str]:
        """Paths of every published file (recorded ones; pending renames finished first).

        Raises:
            FileNotFoundError: A recorded file is gone from the directory (deleted by hand).
        """
        self.finish_publishing()
        paths = [self._final_path(name) for name in self.recorded()]
        missing = [path for path in paths if not self._exists(path)]
        if missing:
            raise FileNotFoundError(
                f"sink {self._name!r}: {len(missing)} recorded file(s) are missing from "
                f"{self._directory}, e.g. {missing[0]}; they were deleted outside millstream"
            )
        return paths

    def read(self, schema: pa.Schema | None = None) -> pa.Table:
        """Every published row, one table (files in name order).

        Args:
            schema: The schema of an empty result (when nothing was published yet).
        """
        paths = self.files()
        if not paths:
            return (schema or pa.schema([])).empty_table()
        return pa.concat_tables(pq.read_table(path, filesystem=self._fs) for path in paths)

    def vacuum(self, older_than_seconds: float = 3600.0) -> list[str]:
        """Delete staged files that were never recorded; returns their names.

        Only files older than ``older_than_seconds`` go: a younger one may belong to a
        commit still under way. Keep it above the longest ``reduce`` plus commit.
        """
        self.finish_publishing()
        recorded = self.recorded()
        selector = pafs.FileSelector(f"{self._root}/{STAGING}", allow_not_found=True)
        cutoff = time.time() - older_than_seconds
        removed = []
        for info in self._fs.get_file_info(selector):
            if info.base_name in recorded or info.type != pafs.FileType.File:
                continue
            modified = info.mtime.timestamp() if info.mtime is not None else 0.0
            if modified < cutoff:
                self._delete(info.path)
                removed.append(info.base_name)
        return removed

    def close(self) -> None:
        """Close the store connections."""
        self._store.close()

    def __repr__(self) -> str:
        return f"ParquetSink({self._store.url!r}, {self._name!r}, {self._directory!r})"


def _as_uri(directory: str) -> str:
    if "://" in directory:
        return directory
    return os.path.abspath(directory)


__all__ = ["STAGING", "ParquetSink", "StagedFile"]
