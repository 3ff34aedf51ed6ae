"""A replayable directory of Parquet / Arrow IPC files, one subdirectory per partition.

Layout: ``<root>/<partition dir>/<files>``. Partition directories are taken in sorted name
order (partition 0 is the first), files inside each in sorted name order, so the read order
is deterministic. The input is bounded: once every file is read the reader reports the end.
Files are never deleted by ``trim`` (the directory is the log's durable copy); trimming
only lets the reader forget files it has passed.
"""

from __future__ import annotations

import bisect
import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from millstream.exceptions import ConfigurationError, InputError, SchemaEvolutionError
from millstream.inputs.base import ReadResult
from millstream.schema_unification import common_type, evolve

SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
_TOKEN = struct.Struct("<qq")


def _encode_token(file_index: int, row_offset: int) -> bytes:
    return _TOKEN.pack(file_index, row_offset)


def _decode_token(token: bytes) -> tuple[int, int]:
    if not token:
        return 0, 0
    try:
        file_index, row_offset = _TOKEN.unpack(token)
    except struct.error as exc:
        raise InputError(f"bad ParquetLog continuation token {token!r}") from exc
    return int(file_index), int(row_offset)


@dataclass(frozen=True)
class ParquetLog:
    """A bounded, replayable input: one subdirectory of files per partition.

    Args:
        path: The root directory. Each subdirectory is a partition (sorted by name); each
            holds ``.parquet`` or Arrow IPC (``.arrow``/``.feather``/``.ipc``) files read in
            sorted name order. A partition's schema may change from file to file by the
            safe changes of :mod:`millstream.schema_unification` (``map`` sees each batch
            as written, one schema per batch); an unsafe change stops the run with an
            :class:`~millstream.exceptions.InputError` naming the file and the column.
        columns: Read only these columns (the mapper sees nothing else). Skipping columns
            the mapper does not use saves most of the decoding. A column added later (a
            safe change: nullable) reads as nulls from the files written before it, of
            the type the log's files that have it unify to; a column no file of the log
            has, or one that is ``not null`` where it exists, stops the read with an
            :class:`~millstream.exceptions.InputError` naming the column and the file.
    """

    path: str
    columns: tuple[str, ...] | None = None

    def _partitions(self) -> list[Path]:
        root = Path(self.path)
        if not root.is_dir():
            raise ConfigurationError(
                f"ParquetLog input {root} is not a directory; create it with one "
                "subdirectory of Parquet files per partition"
            )
        parts = sorted(p for p in root.iterdir() if p.is_dir())
        if not parts:
            raise ConfigurationError(
                f"ParquetLog input {root} has no partition subdirectories; put each "
                "partition's files in its own subdirectory (e.g. partition=0/part-0.parquet)"
            )
        return parts

    @property
    def num_partitions(self) -> int:
        """Number of partitions (subdirectories)."""
        return len(self._partitions())

    def end_row_index(self, partition: int) -> int:
        """Rows in partition ``partition`` now: the index after its last row.

        Read from the files' metadata (a footer per file, cached while the file is
        unchanged); ``millstream status`` shows a mapper's lag with it.
        """
        total = 0
        for path in sorted(p for p in self._partitions()[partition].iterdir()):
            if path.suffix in SUFFIXES:
                stat = path.stat()
                total += _file_rows(str(path), stat.st_size, stat.st_mtime_ns)
        return total

    def reader(self, partition: int) -> ParquetLogReader:
        """The reader of partition ``partition``."""
        parts = self._partitions()
        if not 0 <= partition < len(parts):
            raise ConfigurationError(
                f"partition {partition} out of range: {self.path} has {len(parts)} partitions"
            )
        return ParquetLogReader(parts[partition], columns=self.columns, log_partitions=parts)


@functools.lru_cache(maxsize=4096)
def _file_rows(path: str, size: int, mtime_ns: int) -> int:
    """Rows of one input file (``size`` and ``mtime_ns`` key the cache)."""
    file = _File(Path(path), None)
    try:
        return file.num_rows
    finally:
        file.close()


@functools.lru_cache(maxsize=4096)
def _file_schema(path: str, size: int, mtime_ns: int) -> pa.Schema:
    """The schema of one input file, from its footer (``size`` and ``mtime_ns`` key the
    cache)."""
    if path.endswith(".parquet"):
        return pq.read_schema(path)
    with pa.memory_map(path) as source:
        return ipc.open_file(source).schema


def _schema_of(path: Path) -> pa.Schema:
    stat = path.stat()
    return _file_schema(str(path), stat.st_size, stat.st_mtime_ns)


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


class _File:
    """One open input file, read a row group (Parquet) or record batch (IPC) at a time."""

    def __init__(
        self,
        path: Path,
        columns: list[str] | None,
        absent: Callable[[Path, pa.Schema, list[str]], list[pa.Field]] | None = None,
    ) -> None:
        self.path = path
        self._columns = columns
        self._absent: list[pa.Field] = []
        """Columns asked for that the file lacks: read as nulls."""
        self._parquet: pq.ParquetFile | None = None
        self._ipc: ipc.RecordBatchFileReader | None = None
        self._map: pa.MemoryMappedFile | None = None
        if path.suffix == ".parquet":
            self._parquet = pq.ParquetFile(path)
            meta = self._parquet.metadata
            sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            schema = self._parquet.schema_arrow
        else:
            self._map = pa.memory_map(str(path))
            self._ipc = ipc.open_file(self._map)
            sizes = [self._ipc.get_batch(i).num_rows for i in range(self._ipc.num_record_batches)]
            schema = self._ipc.schema
        if columns is not None:
            missing = [c for c in columns if c not in schema.names]
            if missing:
                if absent is None:
                    raise InputError(
                        f"input file {path} has no column(s) {missing} (it has "
                        f"{schema.names}); fix the ParquetLog's columns or the file"
                    )
                self._absent = absent(path, schema, missing)
                self._columns = [c for c in columns if c in schema.names]
            filled = {field.name: field for field in self._absent}
            written = pa.schema([schema.field(c) for c in columns if c not in filled])
            schema = pa.schema([filled[c] if c in filled else schema.field(c) for c in columns])
        else:
            written = schema
        self.schema = schema
        """The schema its rows are read in (the columns asked for, absent ones null)."""
        self.written = written
        """The schema of its columns asked for that it has: what schema evolution checks."""
        self.starts = [0]
        for size in sizes:
            self.starts.append(self.starts[-1] + size)

    @property
    def num_rows(self) -> int:
        return self.starts[-1]

    def group_of(self, row: int) -> int:
        return bisect.bisect_right(self.starts, row) - 1

    def read_group(self, group: int) -> pa.Table:
        if self._parquet is not None:
            table = self._parquet.read_row_group(group, columns=self._columns)
        else:
            assert self._ipc is not None
            batch = self._ipc.get_batch(group)
            if self._columns is not None:
                batch = batch.select(self._columns)
            table = pa.Table.from_batches([batch])
        if self._absent:
            columns = {name: table[name] for name in table.column_names}
            for field in self._absent:
                columns[field.name] = pa.chunked_array([pa.nulls(table.num_rows, field.type)])
            table = pa.table([columns[name] for name in self.schema.names], schema=self.schema)
        return table.combine_chunks()

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
        if self._map is not None:
            self._map.close()


class ParquetLogReader:
    """Reads one partition directory; the continuation token is (file index, row offset).

    Holds one file open and one row group in memory at a time.

    Args:
        directory: The partition's directory.
        columns: Read only these columns (see :class:`ParquetLog`).
        log_partitions: Every partition directory of the log: where the type of a column
            this partition's early files lack is looked for (the directory alone if not
            given).
    """

    def __init__(
        self,
        directory: Path,
        *,
        columns: Sequence[str] | None = None,
        log_partitions: Sequence[Path] = (),
    ) -> None:
        self._dir = directory
        self._log_partitions = list(log_partitions) or [directory]
        self._files = sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES)
        self._columns = list(columns) if columns is not None else None
        self._unified: list[pa.Schema] = []
        """Per file, in order so far, the unified schema of the files up to it."""
        self._file: _File | None = None
        self._file_index = -1
        self._group: tuple[int, pa.Table] | None = None

    def _guard(self, path: Path, exc: Exception) -> InputError:
        reason = " ".join(str(exc).split())
        return InputError(
            f"cannot read input file {path}: {reason}. Replace or repair the file (it must "
            "hold the same rows as before, in the same order) and restart the processor"
        )

    def _open(self, file_index: int) -> _File:
        if self._file is not None and self._file_index == file_index:
            return self._file
        opened = self._open_checked(file_index)
        try:
            self._check_schema(file_index, opened)
        except InputError:
            opened.close()
            raise
        self._forget()
        self._file, self._file_index = opened, file_index
        return opened

    def _check_schema(self, file_index: int, file: _File) -> None:
        """Check that the file's schema is a safe change of the files before it, and
        record the unified schema through it (the first time it is seen)."""
        if file_index == 0:
            unified = file.written
        else:
            before = self._unified_through(file_index - 1)
            try:
                unified = evolve(before, file.written)
            except SchemaEvolutionError as exc:
                raise InputError(
                    f"schema change inside partition {self._dir}: {file.path} "
                    f"({_describe(file.written)}) is not a safe change of the files before it "
                    f"({_describe(before)}): {exc}. Rewrite the file with a safe change (see "
                    "millstream.schema_unification) and restart the processor"
                ) from exc
        if len(self._unified) == file_index:
            self._unified.append(unified)

    def _unified_through(self, file_index: int) -> pa.Schema:
        """The unified schema of the partition's files up to ``file_index``."""
        while len(self._unified) <= file_index:
            at = len(self._unified)
            file = self._open_checked(at)
            try:
                self._check_schema(at, file)
            finally:
                file.close()
        return self._unified[file_index]

    def _open_checked(self, file_index: int) -> _File:
        path = self._files[file_index]
        try:
            return _File(path, self._columns, self._absent_columns)
        except (pa.ArrowException, OSError) as exc:
            raise self._guard(path, exc) from exc

    def _absent_columns(self, path: Path, schema: pa.Schema, names: list[str]) -> list[pa.Field]:
        """The columns ``names``, which the file at ``path`` lacks, as nullable fields of
        the type the log's files that have them unify to: the file reads them as nulls.

        Raises:
            InputError: A column is in no file of the log, is ``not null`` in a file, or
                has types with no common one.
        """
        found: dict[str, list[tuple[Path, pa.Field]]] = {name: [] for name in names}
        for directory in self._log_partitions:
            for other in sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES):
                try:
                    other_schema = _schema_of(other)
                except (pa.ArrowException, OSError) as exc:
                    raise self._guard(other, exc) from exc
                for name in names:
                    if name in other_schema.names:
                        found[name].append((other, other_schema.field(name)))
        fields = []
        for name in names:
            if not found[name]:
                raise InputError(
                    f"ParquetLog(columns=...) names column {name!r}, which no file of the log "
                    f"has (input file {path} has {schema.names}); fix the columns or the files"
                )
            kind = found[name][0][1].type
            for other, field in found[name]:
                if not field.nullable:
                    raise InputError(
                        f"column {name!r} is not null in input file {other} but input file "
                        f"{path} has no such column, so its rows have no value there; write "
                        "the column as nullable, or leave it out of ParquetLog(columns=...)"
                    )
                joined = common_type(kind, field.type)
                if joined is None:
                    raise InputError(
                        f"column {name!r} is {field.type} in input file {other} and {kind} "
                        f"in files before it: the types hold different kinds of values, so "
                        f"input file {path}, which lacks the column, cannot read it as nulls "
                        "of one type; rewrite the files with compatible types"
                    )
                kind = joined
            fields.append(pa.field(name, kind, nullable=True))
        return fields

    def _read_group(self, file: _File, group: int) -> pa.Table:
        if self._group is not None and self._group[0] == group:
            return self._group[1]
        try:
            table = file.read_group(group)
        except (pa.ArrowException, OSError) as exc:
            raise self._guard(file.path, exc) from exc
        self._group = (group, table)
        return table

    def read(
        self, begin_row_index: int, end_row_index_hint: int, continuation_token: bytes
    ) -> ReadResult:
        """Read up to ``end_row_index_hint - begin_row_index`` rows from the token onwards."""
        file_index, offset = _decode_token(continuation_token)
        want = max(1, end_row_index_hint - begin_row_index)
        pieces: list[pa.RecordBatch] = []
        got = 0
        while got < want and file_index < len(self._files):
            file = self._open(file_index)
            if pieces and not pieces[0].schema.equals(file.schema):
                break  # a batch holds rows of one schema: as written
            if offset >= file.num_rows:
                file_index, offset = file_index + 1, 0
                continue
            group = file.group_of(offset)
            table = self._read_group(file, group)
            start = offset - file.starts[group]
            take = min(want - got, table.num_rows - start)
            pieces.extend(table.slice(start, take).to_batches())
            got += take
            offset += take
            if offset >= file.num_rows:
                file_index, offset = file_index + 1, 0
        token = _encode_token(file_index, offset)
        end = file_index >= len(self._files)
        if not pieces:
            return ReadResult(None, token, end)
        if len(pieces) == 1:
            return ReadResult(pieces[0], token, end)
        batch = pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]
        return ReadResult(batch, token, end)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Forget what lies before the token; the files stay (the directory is the log)."""
        file_index, _ = _decode_token(continuation_token)
        if file_index > self._file_index:
            self._forget()

    def _forget(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._file_index, self._group = None, -1, None

    def close(self) -> None:
        """Close the open file."""
        self._forget()
