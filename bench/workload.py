"""Deterministic keyed workload for the end-to-end benchmarks, and its expected results.

Layout under ``<root>/<spec.dirname>/``::

    manifest.json                     the parameters, row and byte counts (written last)
    partition=<p>/part-<k>.parquet    P partitions of several files each
    expected_sum.parquet              key, total  (sum of value per key)
    expected_smallest.parquet         key, count, s0, s1, s2  (three smallest payloads)
    expected_counters_<n>.parquet     key and n counters (bench.counters)

Rows: int64 ``key`` uniform over ``keys`` keys, int64 ``value`` in ``[0, 1,000,000)``, and a
64-character ASCII ``payload`` (random, so it does not compress): 8 + 8 + 64 bytes plus a
4-byte string offset, 84 bytes per row in Arrow. Every file is generated from its own seed
``(seed, partition, file)`` so the data depends only on the parameters, not on how it is
generated. Expected results are computed with pyarrow alone, independently of any system
under test. Generation is idempotent: a directory whose manifest matches is reused.

Run: ``.venv/bin/python -m bench.workload --rows 1000000`` (prints the directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

DEFAULT_ROOT = Path(__file__).resolve().parent / "results" / "data"
SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("payload", pa.string())])
PAYLOAD_BYTES = 64
ROW_BYTES = 8 + 8 + PAYLOAD_BYTES + 4
SMALLEST = 3
_ALPHABET = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-", dtype=np.uint8
)
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of one generated data set.

    Args:
        rows: Total rows over all partitions.
        partitions: Number of partition directories (one mapper each in millstream).
        keys: Number of distinct keys the uniform generator draws from.
        rows_per_file: Rows per Parquet file, so streaming sources see several files.
        seed: Seed of the generator.
    """

    rows: int = 5_000_000
    partitions: int = 2
    keys: int = 100_000
    rows_per_file: int = 250_000
    seed: int = 20_240_601

    @property
    def dirname(self) -> str:
        """Directory name that encodes every parameter."""
        return (
            f"rows={self.rows}-partitions={self.partitions}-keys={self.keys}"
            f"-file={self.rows_per_file}-seed={self.seed}"
        )

    def partition_rows(self, partition: int) -> int:
        """Rows of one partition (the first ones take the remainder)."""
        base, extra = divmod(self.rows, self.partitions)
        return base + (1 if partition < extra else 0)


@dataclass(frozen=True)
class Workload:
    """A generated data set on disk."""

    spec: WorkloadSpec
    path: Path

    @property
    def input_bytes(self) -> int:
        """Logical input size: rows times 84 bytes (the Arrow size of a row)."""
        return self.spec.rows * ROW_BYTES

    @property
    def parquet_bytes(self) -> int:
        """Bytes of the Parquet files on disk."""
        return int(json.loads((self.path / "manifest.json").read_text())["parquet_bytes"])

    def partition_dirs(self) -> list[Path]:
        """The partition directories in partition order."""
        return [self.path / f"partition={p}" for p in range(self.spec.partitions)]

    def files(self) -> list[Path]:
        """Every Parquet file, partition by partition, in read order."""
        return [f for d in self.partition_dirs() for f in sorted(d.glob("*.parquet"))]

    def expected_sum(self) -> pa.Table:
        """``key, total`` sorted by key; computed on first use and kept next to the data."""
        path = self.path / "expected_sum.parquet"
        if not path.exists():
            _write_atomic(path, expected_sum(self._dataset()))
        return pq.read_table(path)

    def expected_smallest(self) -> pa.Table:
        """``key, count, s0, s1, s2`` sorted by key (``s1``/``s2`` null for rarer keys)."""
        path = self.path / "expected_smallest.parquet"
        if not path.exists():
            _write_atomic(path, expected_smallest(self._dataset()))
        return pq.read_table(path)

    def expected_counters(self, n: int) -> pa.Table:
        """``key`` and the first ``n`` counters of :mod:`bench.counters`, sorted by key."""
        from bench.counters import aggregate

        path = self.path / f"expected_counters_{n}.parquet"
        if not path.exists():
            _write_atomic(path, aggregate(self._dataset(), n))
        return pq.read_table(path)

    def _dataset(self) -> pa.Table:
        return ds.dataset(
            [str(f) for f in self.files()], format="parquet", schema=SCHEMA
        ).to_table()


def _file_table(spec: WorkloadSpec, partition: int, file_index: int, rows: int) -> pa.Table:
    rng = np.random.default_rng([spec.seed, partition, file_index])
    keys = rng.integers(0, spec.keys, size=rows, dtype=np.int64)
    values = rng.integers(0, 1_000_000, size=rows, dtype=np.int64)
    chars = _ALPHABET[rng.integers(0, len(_ALPHABET), size=rows * PAYLOAD_BYTES, dtype=np.uint8)]
    offsets = np.arange(0, (rows + 1) * PAYLOAD_BYTES, PAYLOAD_BYTES, dtype=np.int32)
    payload = pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(chars))
    return pa.table([pa.array(keys), pa.array(values), payload], schema=SCHEMA)


def _write_atomic(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def expected_sum(table: pa.Table) -> pa.Table:
    """Sum of ``value`` per ``key``, sorted by key."""
    out = table.group_by("key").aggregate([("value", "sum")])
    out = out.rename_columns(["key", "total"]).sort_by("key")
    return out.select(["key", "total"])


def expected_smallest(table: pa.Table) -> pa.Table:
    """Per key: row count and the three smallest payloads (``s0 <= s1 <= s2``), sorted by key."""
    table = table.select(["key", "payload"])
    order = pc.sort_indices(table, sort_keys=[("key", "ascending"), ("payload", "ascending")])
    keys = table["key"].take(order).to_numpy()
    payloads = table["payload"].take(order).combine_chunks()
    n = len(keys)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.diff(np.r_[starts, n])
    columns: dict[str, pa.Array] = {
        "key": pa.array(keys[starts]),
        "count": pa.array(counts.astype(np.int64)),
    }
    for rank in range(SMALLEST):
        present = counts > rank
        positions = np.where(present, starts + rank, 0)
        taken = payloads.take(pa.array(positions))
        columns[f"s{rank}"] = pc.if_else(
            pa.array(present), taken, pa.nulls(len(starts), pa.string())
        )
    return pa.table(columns)


def generate(spec: WorkloadSpec, root: Path = DEFAULT_ROOT, *, verbose: bool = False) -> Workload:
    """Generate the data set (or reuse it when a matching manifest is present).

    Args:
        spec: The parameters.
        root: Directory under which ``spec.dirname`` is created.
        verbose: Print progress.

    Returns:
        The data set. Expected results are computed lazily by its ``expected_*`` methods.
    """
    path = Path(root) / spec.dirname
    manifest_path = path / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("spec") == asdict(spec) and manifest.get("version") == _FORMAT_VERSION:
            return Workload(spec, path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    parquet_bytes = 0
    for partition in range(spec.partitions):
        part_dir = path / f"partition={partition}"
        part_dir.mkdir()
        remaining = spec.partition_rows(partition)
        file_index = 0
        while remaining > 0:
            rows = min(spec.rows_per_file, remaining)
            file_path = part_dir / f"part-{file_index:05d}.parquet"
            _write_atomic(file_path, _file_table(spec, partition, file_index, rows))
            parquet_bytes += file_path.stat().st_size
            remaining -= rows
            file_index += 1
        if verbose:
            print(f"  generated partition {partition}: {file_index} files", flush=True)
    manifest = {
        "version": _FORMAT_VERSION,
        "spec": asdict(spec),
        "row_bytes": ROW_BYTES,
        "input_bytes": spec.rows * ROW_BYTES,
        "parquet_bytes": parquet_bytes,
    }
    tmp = manifest_path.with_name("manifest.json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, manifest_path)
    return Workload(spec, path)


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``WorkloadSpec`` fields as command-line options."""
    defaults = WorkloadSpec()
    parser.add_argument("--rows", type=int, default=defaults.rows)
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--rows-per-file", type=int, default=defaults.rows_per_file)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--data-root", type=Path, default=DEFAULT_ROOT)


def spec_from_args(args: argparse.Namespace, rows: int | None = None) -> WorkloadSpec:
    """A ``WorkloadSpec`` from options added by :func:`add_spec_arguments`."""
    return WorkloadSpec(
        rows=args.rows if rows is None else rows,
        partitions=args.partitions,
        keys=args.keys,
        rows_per_file=args.rows_per_file,
        seed=args.seed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_spec_arguments(parser)
    parser.add_argument("--expected", action="store_true", help="also compute expected results")
    args = parser.parse_args()
    workload = generate(spec_from_args(args), args.data_root, verbose=True)
    if args.expected:
        workload.expected_sum()
        workload.expected_smallest()
    print(workload.path)


if __name__ == "__main__":
    main()
