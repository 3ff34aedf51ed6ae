"""A host cut off for a minute: the other parts' commit rate during the cut, as a share of
before, and the time from the heal until the cut part commits at its rate of before.

The keyed sum runs on hosts of their own (network namespaces, ``tests/hosts``): mapper m on
host m, reducer r on host 2 + r, over mutual TLS; its mappers are slowed to a fixed offered
load (``--map-seconds`` per batch of 1,000 rows), so the rates compare like with like.

- ``--cut mapper`` / ``--cut reducer``: mapper 0's / reducer 0's host goes down (its links),
  on the SQLite store (a file every host shares: no network cut reaches it).
- ``--cut store``: the store is FoundationDB on a host of its own (host 5; the runner and
  this measurement on host 4), and the store's host is cut from every worker host for the
  while (the measurement still reaches it, to count): no part can commit.
- ``--cut reducer-from-store``: the same, but only reducer 0's host is cut from the store.

Run as root from the repository root:

    PYTHONPATH=python python -m bench.partition_cut --cut mapper --seconds 60

A part's commit rate is how far its reducers' committed indices advance per second, summed
over the (reducer, mapper) pairs of the part: shuffle rows (mappers pre-aggregate each
batch), counted once per reducer.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import millstream  # noqa: F401  (before grpc: it turns gRPC's fork handlers off)
from millstream.runner.forkserver import start_fork_server

from tests.support.hosts.cluster import Cluster, inside, start_foundationdb
from tests.support.hosts.hosted import (
    GatedKeyedSumMapper,
    Layout,
    committed,
    hosted_runner,
    with_tls,
)
from tests.support.jobs import (
    expected_sums,
    keyed_processor,
    read_output,
    tuning,
    write_keyed_input,
)

STEADY_SHARE = 0.8
"""Steady again: the cut part's rate over a one-second window back to this share of before."""


def _sample(processor: object) -> list[tuple[int, ...]]:
    return committed(processor)  # type: ignore[arg-type]


def _rate(
    a: tuple[float, list[tuple[int, ...]]],
    b: tuple[float, list[tuple[int, ...]]],
    cells: list[tuple[int, int]],
) -> float:
    rows = sum(b[1][r][m] - a[1][r][m] for r, m in cells)
    return rows / (b[0] - a[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cut", choices=["mapper", "reducer", "store", "reducer-from-store"], required=True
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the cut lasts")
    parser.add_argument("--before", type=float, default=15.0)
    parser.add_argument("--after", type=float, default=30.0)
    parser.add_argument("--map-seconds", type=float, default=0.1)
    args = parser.parse_args(argv)
    per_second = 2 * 1_000 / args.map_seconds
    rows = int(per_second * (args.before + args.seconds + args.after + 20))
    directory = Path(tempfile.mkdtemp(prefix="millstream-cut-"))
    data = write_keyed_input(directory / "in", rows, partitions=2, file_rows=50_000)
    gate = directory / "gate"
    gate.touch()
    processor = keyed_processor(
        data,
        directory / "state.db",
        tune=with_tls(tuning(batch_rows=1_000), directory / "tls"),
        mapper=GatedKeyedSumMapper,
        config={"gate": str(gate), "map_seconds": args.map_seconds},
    )
    layout = Layout(num_mappers=2, num_reducers=2)
    on_store_host = args.cut in ("store", "reducer-from-store")
    driver, store_host = layout.size, layout.size + 1
    # The cut part's cells (reducer, mapper) and the others'.
    if args.cut == "mapper":
        host, cut_cells, other_cells = 0, [(0, 0), (1, 0)], [(0, 1), (1, 1)]
    elif args.cut == "store":
        host, cut_cells, other_cells = store_host, [(0, 0), (0, 1), (1, 0), (1, 1)], []
    else:
        host, cut_cells, other_cells = 2, [(0, 0), (0, 1)], [(1, 0), (1, 1)]
    with (
        Cluster(layout.size + (2 if on_store_host else 0)) as cluster,
        contextlib.ExitStack() as stack,
    ):
        if on_store_host:
            fdb = start_foundationdb(cluster.hosts[store_host], directory / "fdb")
            stack.callback(fdb.stop)
            processor = dataclasses.replace(processor, store=fdb.url)
            start_fork_server(processor)  # in this machine's network: the workers move
            stack.enter_context(inside(cluster.hosts[driver]))
        runner = hosted_runner(processor, layout, cluster)
        runner.start()
        samples: list[tuple[float, list[tuple[int, ...]]]] = []

        def run_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if runner.poll():
                    raise RuntimeError("the run drained during the measurement: more rows")
                samples.append((time.monotonic(), _sample(processor)))
                time.sleep(0.2)

        while min(map(min, _sample(processor))) < 0:
            runner.poll()
            time.sleep(0.1)
        run_for(5.0)  # warm-up
        start_before = len(samples)
        run_for(args.before)
        at_cut = len(samples)
        if args.cut == "store":
            cluster.cut(store_host, range(layout.size))
        elif args.cut == "reducer-from-store":
            cluster.cut(host, [store_host])
        else:
            cluster.isolate(host)
        run_for(args.seconds)
        cluster.heal()
        healed = time.monotonic()
        at_heal = len(samples)
        run_for(args.after)
        before = samples[start_before], samples[at_cut - 1]
        others_before = _rate(*before, other_cells)
        others_during = _rate(samples[at_cut], samples[at_heal - 1], other_cells)
        cut_before = _rate(*before, cut_cells)
        cut_during = _rate(samples[at_cut], samples[at_heal - 1], cut_cells)
        steady = None
        for i in range(at_heal, len(samples)):
            j = next(
                (k for k in range(i, len(samples)) if samples[k][0] - samples[i][0] >= 1), None
            )
            if j is None:
                break
            if _rate(samples[i], samples[j], cut_cells) >= STEADY_SHARE * cut_before:
                steady = samples[i][0] - healed
                break
        gate.unlink()
        while not runner.poll():
            time.sleep(0.1)
        runner.finish()
        exact = read_output(processor, "sum") == expected_sums(data)
    others = (
        f"others' commit rate {others_before:,.0f} rows/s before, {others_during:,.0f} "
        f"during ({others_during / others_before:.0%}); "
        if other_cells
        else ""
    )
    how = {"store": "store host from every worker host", "reducer-from-store": "from the store"}
    print(
        f"{args.cut} cut {args.seconds:.0f}s ({how.get(args.cut, 'link down')}): {others}"
        f"cut part {cut_before:,.0f} rows/s before, {cut_during:,.0f} during "
        f"({cut_during / cut_before:.0%}), at {STEADY_SHARE:.0%} of it again "
        + (f"{steady:.1f}s after the heal" if steady is not None else "not within --after")
        + f"; exact: {exact}"
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
