"""A two-stage pipeline: word counts per minute, then the top words of each minute.

Run it with ``python -m examples.pipeline``. The input is a generated log of timestamped
text lines (``ts`` in epoch milliseconds, a few seconds out of order). The first processor
counts words in tumbling one-minute panes of event time (``ms.event_time``, with the
persistent-queue reducer: open panes write nothing) and emits each closed pane's
``(window_start, window_end, word, n)`` rows to the store queue
``word-counts``, in the transaction that commits it. The second processor reads that queue
and keeps the ten most frequent words of each minute under ``("top", window_start)``. Each
count reaches the second stage exactly once, whatever fails; when the first stage drains
it emits the panes still open and seals the queue, and the second drains after it.

Input and state live under ``MILLSTREAM_EXAMPLE_DIR`` (default
``/tmp/millstream-pipeline``); ``MILLSTREAM_EXAMPLE_ROWS`` lines (default 200,000).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import millstream as ms
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from examples.word_count import vocabulary

ROOT = Path(os.environ.get("MILLSTREAM_EXAMPLE_DIR", "/tmp/millstream-pipeline"))
ROWS = int(os.environ.get("MILLSTREAM_EXAMPLE_ROWS", "200000"))
TOP = 10
MINUTE = 60_000
DISORDER_MS = 3_000


def generate(root: Path, rows: int, partitions: int = 2, seed: int = 13) -> Path:
    """Write the timestamped text log once: lines 20 ms apart per partition."""
    data = root / f"events-{rows}-{partitions}"
    if (data / "_SUCCESS").exists():
        return data
    rng = np.random.default_rng(seed)
    words = np.array(vocabulary(2_000))
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    per_partition = rows // partitions
    for p in range(partitions):
        part = data / f"partition={p}"
        part.mkdir(parents=True, exist_ok=True)
        ts = 1_700_000_000_000 + np.arange(per_partition, dtype=np.int64) * 20
        ts += rng.integers(0, DISORDER_MS + 1, per_partition)
        lengths = rng.integers(1, 9, per_partition)
        picked = rng.choice(words, size=int(lengths.sum()), p=weights)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        lines = [" ".join(picked[bounds[i] : bounds[i + 1]]) for i in range(per_partition)]
        pq.write_table(pa.table({"ts": ts, "line": lines}), part / "part-00000.parquet")
    (data / "_SUCCESS").touch()
    return data


def words_with_time(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """One ``(ts, word)`` row per word of each line."""
    split = pc.utf8_split_whitespace(batch["line"])
    ts = np.repeat(np.asarray(batch["ts"]), np.asarray(pc.list_value_length(split)))
    return pa.table({"ts": pa.array(ts, pa.int64()), "word": pc.list_flatten(split)})


class WordsByMinute(ms.event_time.PaneMapper):
    """Splits lines into timestamped words before the pane mapper combines them."""

    def prepare(self, batch: pa.RecordBatch) -> pa.Table:
        return words_with_time(batch)


COUNTS = ms.event_time.Panes(
    time="ts",
    key="word",
    size=MINUTE,
    lateness=DISORDER_MS,
    aggregates={"n": (None, "count")},
    output="word-counts",
)


class ByPane(ms.Mapper):
    """Routes the first stage's rows by their pane, so one reducer sees a whole minute."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(
            batch, key="window_start", num_reducers=self.spec.num_reducers
        )


def top_words(pane: pa.Table, n: int = TOP) -> list[tuple[str, int]]:
    """The ``n`` most frequent words of ``(word, n)`` rows, ties broken by the word."""
    ordered = pane.sort_by([("n", "descending"), ("word", "ascending")]).slice(0, n)
    return list(zip(ordered["word"].to_pylist(), ordered["n"].to_pylist(), strict=True))


class TopWordsPerMinute(ms.Reducer):
    """Keeps the top words of each minute under ``("top", window_start)``.

    Each ``(pane, word)`` count arrives once and final, so a minute's top words are the
    top of its stored top words and the counts that just arrived.
    """

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch]).select(["window_start", "word", "n"])
        for start in pc.unique(table["window_start"]).to_pylist():
            rows = table.filter(pc.equal(table["window_start"], start)).select(["word", "n"])
            stored = txn.get(("top", start))
            if stored is not None:
                words, counts = zip(*json.loads(stored), strict=True)
                rows = pa.concat_tables(
                    [rows, pa.table({"word": list(words), "n": pa.array(counts, pa.int64())})]
                )
            txn.set(("top", start), json.dumps(top_words(rows)).encode())


def make_pipeline(root: Path = ROOT, rows: int = ROWS) -> list[ms.Processor]:
    """The two processors over generated input under ``root``, sharing one store."""
    root.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{root / f'state-{rows}.db'}"
    counts = ms.inputs.StoreQueue(store, "word-counts", num_partitions=2)
    words = ms.Processor(
        mapper=WordsByMinute,
        # Open panes' counts stay pending in the mappers' memory; only results are written.
        reducer=ms.event_time.PendingPaneReducer,
        input=ms.inputs.ParquetLog(str(generate(root, rows))),
        store=store,
        num_reducers=2,  # one queue partition per reducer: their appends never conflict
        name="words",
        config={"panes": COUNTS},
        outputs=[counts],
    )
    top = ms.Processor(
        mapper=ByPane,
        reducer=TopWordsPerMinute,
        input=counts,
        store=store,
        num_reducers=2,
        name="top",
    )
    return [words, top]


def read_top(processor: ms.Processor) -> dict[int, list[tuple[str, int]]]:
    """The top words of each minute, as the second stage committed them."""
    store = processor.open_store()
    try:
        with store.read() as txn:
            rows = txn.get_range_startswith(("out", "top"))
    finally:
        store.close()
    return {int(key[-1]): [(str(w), int(n)) for w, n in json.loads(value)] for key, value in rows}


def expected_top(root: Path = ROOT, rows: int = ROWS) -> dict[int, list[tuple[str, int]]]:
    """The top words of each minute computed with pyarrow alone, to check the pipeline."""
    files = sorted(str(p) for p in generate(root, rows).glob("*/*.parquet"))
    words = words_with_time(pq.ParquetDataset(files).read())
    minutes = pc.multiply(pc.divide(words["ts"], MINUTE), MINUTE)
    counts = (
        words.append_column("window_start", minutes)
        .group_by(["window_start", "word"])
        .aggregate([([], "count_all")])
        .rename_columns(["window_start", "word", "n"])
    )
    return {
        start: top_words(counts.filter(pc.equal(counts["window_start"], start)))
        for start in pc.unique(counts["window_start"]).to_pylist()
    }


if __name__ == "__main__":
    pipeline = make_pipeline()
    for summary in ms.run_local_pipeline(pipeline, progress=True):
        print(summary)
    for start, words in sorted(read_top(pipeline[1]).items()):
        print(start, " ".join(f"{word}:{n}" for word, n in words[:5]))
