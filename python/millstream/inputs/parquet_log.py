"""A replayable directory of Parquet / Arrow IPC files, one subdirectory per partition.

Layout: ``<root>/<partition dir>/<files>``. Partition directories are taken in sorted name
order (partition 0 is the first), files inside each in sorted name order, so the read order
is deterministic. The input is bounded: once every file is read the reader reports the end.
Files are never deleted by ``trim`` (the directory is the log's durable copy); trimming
only lets the reader forget files it has passed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from millstream.exceptions import ConfigurationError, InputError
from millstream.inputs.base import ReadResult

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
            sorted name order. All files of a partition must share one schema.
    """

    path: str

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

    def reader(self, partition: int) -> ParquetLogReader:
        """The reader of partition ``partition``."""
        parts = self._partitions()
        if not 0 <= partition < len(parts):
            raise ConfigurationError(
                f"partition {partition} out of range: {self.path} has {len(parts)} partitions"
            )
        return ParquetLogReader(parts[partition])


class ParquetLogReader:
    """Reads one partition directory; the continuation token is (file index, row offset)."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._files = sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES)
        self._schema: pa.Schema | None = None
        self._open_index = -1
        self._open_table: pa.Table | None = None

    def _load(self, file_index: int) -> pa.Table:
        if file_index == self._open_index and self._open_table is not None:
            return self._open_table
        path = self._files[file_index]
        try:
            if path.suffix == ".parquet":
                with pq.ParquetFile(path) as parquet:
                    table = parquet.read()
            else:
                with pa.memory_map(str(path)) as source:
                    table = ipc.open_file(source).read_all()
            table = table.combine_chunks()
        except (pa.ArrowException, OSError) as exc:
            raise InputError(
                f"cannot read input file {path}: {exc}. Replace or repair the file (it must "
                "hold the same rows as before, in the same order) and restart the processor"
            ) from exc
        if self._schema is None:
            self._schema = table.schema
        elif not table.schema.equals(self._schema):
            raise InputError(
                f"schema change inside partition {self._dir}: {path} has schema "
                f"{table.schema} but earlier files have {self._schema}. All files of a "
                "partition must share one schema; rewrite the file or start a new processor"
            )
        self._open_index, self._open_table = file_index, table
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
            table = self._load(file_index)
            if offset >= table.num_rows:
                file_index, offset = file_index + 1, 0
                continue
            take = min(want - got, table.num_rows - offset)
            pieces.extend(table.slice(offset, take).to_batches())
            got += take
            offset += take
            if offset >= table.num_rows:
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
        """Forget files before the token; the files themselves stay (the log is durable)."""
        file_index, _ = _decode_token(continuation_token)
        if file_index > self._open_index:
            self._open_index, self._open_table = -1, None

    def close(self) -> None:
        """Drop the cached file."""
        self._open_index, self._open_table = -1, None
