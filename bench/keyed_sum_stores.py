"""The README's keyed sum (``examples/keyed_sum.py``) on each state store, side by side.

One run per store and size: wall time of ``ms.run_local`` (worker start-up included) until
drained, rows per second, commits, and a key-by-key check of the sums against pyarrow.
FoundationDB runs on the cluster named by ``--fdb-cluster-file`` (for instance one started
by ``../shared/fdb/start-cluster.sh``), emptied before each run; SQLite on a fresh file.

Run::

    export MILLSTREAM_FDB_HOME=$PWD/../shared/fdb
    cluster=$($MILLSTREAM_FDB_HOME/start-cluster.sh /tmp/fdb-bench)
    .venv/bin/python -m bench.keyed_sum_stores --rows 1000000 5000000 --fdb-cluster-file "$cluster"
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import millstream as ms
import pyarrow.dataset as pads
from millstream.ledger import OUTPUT
from millstream.state import decode_int64, open_store

from examples import keyed_sum


def expected_sums(data: Path) -> dict[int, int]:
    """Sum of ``value`` per ``key`` over the input, with pyarrow alone."""
    table = pads.dataset(str(data), format="parquet", partitioning="hive").to_table(
        columns=["key", "value"]
    )
    sums = table.group_by("key").aggregate([("value", "sum")])
    return dict(zip(sums["key"].to_pylist(), sums["value_sum"].to_pylist(), strict=True))


def stored_sums(url: str, name: str) -> dict[int, int]:
    """The ``("sum", key)`` counters the job committed."""
    store = open_store(url, prefix=(name,))
    try:
        with store.read() as txn:
            rows = txn.get_range_startswith((*OUTPUT, "sum"))
        return {key[-1]: decode_int64(value) for key, value in rows}
    finally:
        store.close()


def run_once(root: Path, rows: int, url: str) -> dict[str, float | str]:
    """One drained run of the keyed sum on ``url``; its figures."""
    processor = keyed_sum.make_processor(root, rows)
    processor = ms.Processor(**{**processor.__dict__, "store": url})
    if url.startswith("fdb"):
        store = open_store(url)
        store.transact(lambda txn: txn.clear_range_startswith(()))
        store.close()
    started = time.monotonic()
    summary = ms.run_local(processor)
    wall = time.monotonic() - started
    exact = stored_sums(url, processor.name) == expected_sums(keyed_sum.generate(root, rows))
    return {
        "store": url.split(":", 1)[0],
        "rows": rows,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "rows_read": summary.rows_read,
        "exact": "yes" if exact else "NO",
    }


def main() -> None:
    """Run every size on every store and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--fdb-cluster-file", help="FoundationDB's cluster file (else SQLite only)")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "keyed-sum-stores"
    )
    args = parser.parse_args()
    print("| store | rows | wall s | rows/s | exact |")
    print("| --- | ---: | ---: | ---: | --- |")
    for rows in args.rows:
        urls = [f"sqlite:///{args.dir / f'state-{rows}-{time.time_ns()}.db'}"]
        if args.fdb_cluster_file:
            urls.append(f"fdb://{args.fdb_cluster_file}")
        for url in urls:
            r = run_once(args.dir, rows, url)
            print(
                f"| {r['store']} | {rows:,} | {r['wall_s']:.2f} | {r['rows_per_s']:,.0f} | "
                f"{r['exact']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
