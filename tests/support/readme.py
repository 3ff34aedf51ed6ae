"""The README's examples as data: its fenced blocks, the input they read, the sums they
write (``tests/integration/test_readme.py`` runs them; other tests reuse the pieces)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from millstream.ledger import OUTPUT
from millstream.state import decode_int64, open_store

ROOT = Path(__file__).resolve().parents[2]


ROWS = 6_000


_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<directive>[^\n]*?) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)```",
    re.S,
)


@dataclass(frozen=True)
class Example:
    """One fenced block of a Markdown file."""

    doc: str
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def examples(path: Path) -> list[Example]:
    """The fenced blocks of ``path``, with their skip reasons."""
    text = path.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        directive = match["directive"]
        skip = None
        if directive is not None:
            kind, _, reason = directive.partition(":")
            assert kind.strip() == "skip", f"unknown readme-test directive {directive!r}"
            skip = reason.strip()
        line = text.count("\n", 0, match.start("code"))
        found.append(
            Example(path.relative_to(ROOT).as_posix(), line, match["lang"], match["code"], skip)
        )
    return found


def write_data(root: Path, rows: int = ROWS, partitions: int = 2) -> dict[int, int]:
    """``data/<p>/part-0.parquet`` with int64 ``key`` and ``value``; returns the true sums."""
    rng = np.random.default_rng(11)
    sums: dict[int, int] = {}
    for p in range(partitions):
        keys = rng.integers(0, 300, rows // partitions, dtype=np.int64)
        values = rng.integers(-50, 50, rows // partitions, dtype=np.int64)
        (root / "data" / str(p)).mkdir(parents=True)
        pq.write_table(
            pa.table({"key": keys, "value": values}), root / "data" / str(p) / "part-0.parquet"
        )
        for k, v in zip(keys.tolist(), values.tolist(), strict=True):
            sums[k] = sums.get(k, 0) + v
    return sums


def localized(code: str, tmp: Path) -> str:
    """The block with its ``/tmp/`` paths moved under ``tmp``."""
    return code.replace("/tmp/", f"{tmp}/")


def sums_in(store_url: str, prefix: str = "millstream") -> dict[int, int]:
    """The ``("sum", key)`` counters of the README's job."""
    store = open_store(store_url, prefix=(prefix,))
    try:
        txn = store.create_transaction()
        got = {k[-1]: decode_int64(v) for k, v in txn.get_range_startswith((*OUTPUT, "sum"))}
        txn.reset()
    finally:
        store.close()
    return got


JOB = """
import os
import time

import pyarrow as pa
import millstream as ms


class SlowPreAggregate(ms.Mapper):
    def map(self, batch: pa.RecordBatch) -> ms.Partitioned:
        time.sleep(float(os.environ.get("JOB_MAP_SLEEP", "0")))
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        return ms.Partitioned.by_hash(
            sums.rename_columns(["key", "value"]), key="key", num_reducers=self.spec.num_reducers
        )


class SumIntoStore(ms.Reducer):
    def reduce(self, batch: pa.RecordBatch, txn: ms.Transaction) -> None:
        table = pa.Table.from_batches([batch])
        sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
        txn.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())


processor = ms.Processor(
    mapper=SlowPreAggregate,
    reducer=SumIntoStore,
    input=ms.inputs.ParquetLog("data/"),
    store=os.environ["JOB_STORE"],
    num_reducers=2,
    tuning=ms.Tuning(batch_rows=100, commit_interval_seconds=0.05),
)

if __name__ == "__main__":
    print(ms.run_local(processor, progress=True))
"""
"""The README's job as a script (``job.py``), its map slowed by ``$JOB_MAP_SLEEP`` seconds a
batch, its store at ``$JOB_STORE``."""
