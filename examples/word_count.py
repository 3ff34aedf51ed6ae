"""Word count: how often each word occurs in a generated text log, exactly once.

Run it with ``python -m millstream run examples.word_count:processor``. On first run it writes
its input (``MILLSTREAM_EXAMPLE_ROWS`` lines, default 200,000, of 1-12 words drawn from a
Zipf-like vocabulary of 5,000 words, in 2 partitions) under ``MILLSTREAM_EXAMPLE_DIR``
(default ``/tmp/millstream-word-count``), with the state in a ``state-*.db`` beside it.
Mappers split lines into words and pre-count them per batch before the shuffle; reducers
fold the partial counts into the ``("count", word)`` counters with one batch operation.
"""

from __future__ import annotations

import os
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(os.environ.get("MILLSTREAM_EXAMPLE_DIR", "/tmp/millstream-word-count"))
ROWS = int(os.environ.get("MILLSTREAM_EXAMPLE_ROWS", "200000"))
VOCABULARY = 5_000
PARTITIONS = 2
FILE_ROWS = 50_000


def vocabulary(size: int = VOCABULARY) -> list[str]:
    """The generated words: ``w0`` ... ``w<size-1>``."""
    return [f"w{i}" for i in range(size)]


def generate(
    root: Path,
    rows: int,
    partitions: int = PARTITIONS,
    seed: int = 11,
    file_rows: int = FILE_ROWS,
) -> Path:
    """Write the deterministic text log once (a ``line`` column); returns its directory."""
    data = root / f"text-{rows}-{partitions}-{file_rows}"
    if (data / "_SUCCESS").exists():
        return data
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary())
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    per_partition = rows // partitions
    for p in range(partitions):
        part = data / f"partition={p}"
        part.mkdir(parents=True, exist_ok=True)
        for f, start in enumerate(range(0, per_partition, file_rows)):
            n = min(file_rows, per_partition - start)
            lengths = rng.integers(1, 13, n)
            picked = rng.choice(words, size=int(lengths.sum()), p=weights)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            lines = [" ".join(picked[bounds[i] : bounds[i + 1]]) for i in range(n)]
            pq.write_table(pa.table({"line": lines}), part / f"part-{f:05d}.parquet")
    (data / "_SUCCESS").touch()
    return data


def count_words(lines: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``(word, count)`` of every word in ``lines``, split on whitespace."""
    words = pc.list_flatten(pc.utf8_split_whitespace(lines))
    words = words.filter(pc.not_equal(pc.utf8_length(words), 0))
    table = pa.table({"word": words})
    counted = table.group_by("word", use_threads=False).aggregate([([], "count_all")])
    return counted.rename_columns(["word", "count"])


class SplitWords(ms.Mapper):
    """Splits each line into words, counts them within the batch, routes words by hash."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        counts = count_words(batch.column("line"))
        return ms.Partitioned.by_hash(counts, key="word", num_reducers=self.spec.num_reducers)


class CountWords(ms.Reducer):
    """Folds the partial counts and adds them to the ``("count", word)`` counters."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        sums = pa.Table.from_batches([batch]).group_by("word").aggregate([("count", "sum")])
        txn.add_many(("count",), sums["word"].combine_chunks(), sums["count_sum"].combine_chunks())


def make_processor(
    root: Path = ROOT,
    rows: int = ROWS,
    num_reducers: int = 2,
    tuning: ms.Tuning | None = None,
) -> ms.Processor:
    """The word-count processor over generated input under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    return ms.Processor(
        mapper=SplitWords,
        reducer=CountWords,
        input=ms.inputs.ParquetLog(str(generate(root, rows))),
        store=f"sqlite:///{root / f'state-{rows}.db'}",
        num_reducers=num_reducers,
        name="word_count",
        tuning=tuning or ms.Tuning(batch_rows=20_000, commit_interval_seconds=0.2),
    )


def __getattr__(name: str) -> ms.Processor:
    # ``processor`` is made (and its input generated) on first use, not on import: the
    # pipeline example imports this module's mapper.
    if name == "processor":
        return make_processor()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
