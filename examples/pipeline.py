"""A two-stage pipeline: word counts, then the ten most frequent words, exactly once.

Run it with ``python -m examples.pipeline``. The first processor splits a generated text log
into words (:class:`examples.word_count.SplitWords`) and its reducers append the partial
counts of each batch to the store queue ``word-counts``, in the transaction that commits
the batch. The second processor reads that queue: its one reducer folds the counts into
``("count", word)`` counters and keeps the current top ten words under ``("top",)``. Each
partial count reaches the second stage exactly once, whatever fails; when the first stage
drains it seals the queue, and the second drains after it.

Input and state live under ``MILLSTREAM_EXAMPLE_DIR`` (default
``/tmp/millstream-pipeline``); ``MILLSTREAM_EXAMPLE_ROWS`` lines (default 200,000).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import millstream as ms
import pyarrow as pa
import pyarrow.compute as pc

from examples.word_count import SplitWords, generate

ROOT = Path(os.environ.get("MILLSTREAM_EXAMPLE_DIR", "/tmp/millstream-pipeline"))
ROWS = int(os.environ.get("MILLSTREAM_EXAMPLE_ROWS", "200000"))
TOP = 10


class CountsToQueue(ms.Reducer):
    """Folds the partial counts of a batch and appends ``(word, count)`` to the queue."""

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch]).group_by("word", use_threads=False)
        txn.append(
            "word-counts", table.aggregate([("count", "sum")]).rename_columns(["word", "count"])
        )


class ByWord(ms.Mapper):
    """Routes the first stage's ``(word, count)`` rows by word."""

    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        return ms.Partitioned.by_hash(batch, key="word", num_reducers=self.spec.num_reducers)


def top_words(counts: dict[str, int], n: int = TOP) -> list[tuple[str, int]]:
    """The ``n`` most frequent words, ties broken by the word."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


class TopWords(ms.Reducer):
    """Adds the counts to ``("count", word)`` and keeps the top words under ``("top",)``.

    Counts only grow, so the new top ten are among the old top ten and the words of this
    batch: one read per word of the batch, none of the other words.
    """

    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch]).group_by("word", use_threads=False)
        sums = table.aggregate([("count", "sum")])
        words = sums["word"].combine_chunks()
        deltas = pc.cast(sums["count_sum"].combine_chunks(), pa.int64())
        before = txn.get_many(("count",), words)
        txn.add_many(("count",), words, deltas)
        raw = txn.get(("top",))
        candidates = dict(json.loads(raw)) if raw is not None else {}
        for word, delta, old in zip(words.to_pylist(), deltas.to_pylist(), before, strict=True):
            candidates[word] = (0 if old is None else int.from_bytes(old, "little")) + delta
        txn.set(("top",), json.dumps(top_words(candidates)).encode())


def make_pipeline(root: Path = ROOT, rows: int = ROWS) -> list[ms.Processor]:
    """The two processors over generated input under ``root``, sharing one store."""
    root.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{root / f'state-{rows}.db'}"
    counts = ms.inputs.StoreQueue(store, "word-counts", num_partitions=2)
    words = ms.Processor(
        mapper=SplitWords,
        reducer=CountsToQueue,
        input=ms.inputs.ParquetLog(str(generate(root, rows))),
        store=store,
        num_reducers=2,  # one queue partition per reducer: their appends never conflict
        name="words",
        outputs=[counts],
    )
    top = ms.Processor(
        mapper=ByWord, reducer=TopWords, input=counts, store=store, num_reducers=1, name="top"
    )
    return [words, top]


def read_top(processor: ms.Processor) -> list[tuple[str, int]]:
    """The top words the second stage committed."""
    store = processor.open_store()
    try:
        with store.read() as txn:
            raw = txn.get(("out", "top"))
    finally:
        store.close()
    return [] if raw is None else [(str(w), int(n)) for w, n in json.loads(raw)]


if __name__ == "__main__":
    pipeline = make_pipeline()
    for summary in ms.run_local_pipeline(pipeline, progress=True):
        print(summary)
    for word, count in read_top(pipeline[1]):
        print(f"{word:>8} {count:,}")
