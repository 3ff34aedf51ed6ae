"""Small FoundationDB transactions from a process whose other threads hold the GIL.

A worker process has threads besides the one that talks to the store (a mapper serves
GetRows while it maps). Each transaction here reads one key and writes it back (a future for
the read, one for the commit) while ``--busy`` threads run Python; it prints the median and
p99 of a transaction's wall time. Compare two checkouts by running each with its own
``PYTHONPATH``: how a future is waited for is the store's choice
(:func:`millstream.state.fdb_backend.load_fdb`).

Run: ``python -m bench.fdb_waits --store fdb://<cluster file> [--busy 1] [--commits 300]``.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
from millstream.state import StoreTransaction, open_store


def _spin(stop: threading.Event) -> None:
    count = 0
    while not stop.is_set():
        count += 1


def measure(url: str, busy: int, commits: int) -> list[float]:
    """Seconds each of ``commits`` read-write transactions took beside ``busy`` threads."""
    store = open_store(url, prefix=("bench", "fdb_waits"))
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()

    def update(txn: StoreTransaction) -> None:
        raw = txn.get(("state",))
        txn.set(("state",), (int(raw or b"0") + 1).__str__().encode())

    took = []
    try:
        for _ in range(commits):
            start = time.perf_counter()
            store.transact(update)
            took.append(time.perf_counter() - start)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
        store.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="fdb://<cluster file>")
    parser.add_argument("--busy", type=int, default=1, help="threads running Python beside")
    parser.add_argument("--commits", type=int, default=300)
    args = parser.parse_args()
    ms = np.array(measure(args.store, args.busy, args.commits)) * 1000
    print(
        f"busy threads {args.busy}: {args.commits} transactions, "
        f"median {np.median(ms):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms"
    )


if __name__ == "__main__":
    main()
