"""State store throughput: batch atomic adds, batch sets/gets and small commits.

Run: ``.venv/bin/python bench/bench_store.py [--keys 100000] [--rounds 5]``. Prints key
updates per second for ``add_many`` (100,000 int64 keys per commit by default), the same with
string keys, ``set_many``/``get_many``, and small read-modify-write commits per second.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
from millstream.state import Store, StoreTransaction, open_store
from millstream.state.keys import encode_keys, pack


def _rate(label: str, count: int, seconds: float, unit: str = "key updates/s") -> None:
    print(f"{label:<58} {count / seconds:>12,.0f} {unit}  ({seconds * 1000:.1f} ms)")


def _small_commits(store: Store, commits: int = 500) -> None:
    """Read-modify-write commits of one key, one after another: their rate and the
    median and p99 of one commit's latency (read, write, commit)."""

    def rmw(txn: StoreTransaction) -> None:
        raw = txn.get(("counter",))
        txn.set(("counter",), (int(raw or b"0") + 1).__str__().encode())

    took = []
    for _ in range(commits):
        start = time.perf_counter()
        store.transact(rmw)
        took.append(time.perf_counter() - start)
    _rate("read-modify-write commits (one key)", commits, sum(took), "commits/s")
    ms = np.percentile(np.array(took) * 1000, [50, 99])
    print(f"{'  one commit: median, p99':<58} {ms[0]:>9.2f} ms {ms[1]:>9.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--synchronous", default="full")
    parser.add_argument("--url", default=None, help="store URL (default: a temporary SQLite)")
    parser.add_argument(
        "--commits-only", action="store_true", help="only the small read-modify-write commits"
    )
    args = parser.parse_args()
    n = args.keys
    with tempfile.TemporaryDirectory() as tmp:
        url = (
            args.url or f"sqlite:///{os.path.join(tmp, 'bench.db')}?synchronous={args.synchronous}"
        )
        store = open_store(url, prefix=("bench",))
        rng = np.random.default_rng(1)
        int_keys = pa.array(rng.permutation(n).astype(np.int64))
        str_keys = pa.array([f"word-{i}" for i in rng.permutation(n)])
        deltas = pa.array(rng.integers(1, 100, n, dtype=np.int64))

        if args.commits_only:
            _small_commits(store)
            store.close()
            return
        start = time.perf_counter()
        encode_keys(pack(("bench", "k")), int_keys)
        _rate("encode int64 keys (tuple layer)", n, time.perf_counter() - start, "keys/s")
        start = time.perf_counter()
        encode_keys(pack(("bench", "k")), str_keys)
        _rate("encode string keys (tuple layer)", n, time.perf_counter() - start, "keys/s")

        for name, keys in (("int64", int_keys), ("string", str_keys)):
            for r in range(args.rounds):
                start = time.perf_counter()
                txn = store.create_transaction()
                txn.add_many((name,), keys, deltas)
                txn.commit()
                label = f"add_many {n:,} {name} keys/commit ({'insert' if r == 0 else 'update'})"
                _rate(label, n, time.perf_counter() - start)

        values = pa.array([b"x" * 16] * n, pa.binary())
        start = time.perf_counter()
        txn = store.create_transaction()
        txn.set_many(("s",), int_keys, values)
        txn.commit()
        _rate(f"set_many {n:,} int64 keys/commit (16-byte values)", n, time.perf_counter() - start)
        start = time.perf_counter()
        txn = store.create_transaction()
        txn.get_many(("s",), int_keys)
        txn.commit()
        _rate(f"get_many {n:,} int64 keys", n, time.perf_counter() - start, "keys/s")

        _small_commits(store)
        store.close()


if __name__ == "__main__":
    main()
