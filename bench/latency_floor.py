"""The store's own share of the latency: the queue pipeline of :mod:`bench.latency` without
the shuffle.

:mod:`bench.latency` measures a row from just before the producer's append transaction to
the commit of the reducer transaction that applied it. Two of the steps in between are the
embedded store's, whatever the shuffle does: the append itself (an fsync'd SQLite write
transaction, one writer at a time) and the reducer's commit (another). This benchmark runs
the same producer (:mod:`bench.queue_producer`, the same rows, rate and schedule) into the
same :class:`~millstream.inputs.StoreQueue`, and puts in place of the processor one process
per partition that reads its partition as a mapper does (woken by the append's commit),
sums the rows by key and commits the sums with its read position in one transaction per
read: no window, no GetRows, no rounds, two fewer processes. The latency of a row is again
from just before its append to that commit. What it reports is therefore a floor under
any shuffle on this store and machine: the part of :mod:`bench.latency`'s figures the
shuffle cannot remove.

Every run checks that the committed per-key sums equal the producer's.

Run::

    .venv/bin/python -m bench.latency_floor --rate 62500 --seconds 20
    .venv/bin/python -m bench.latency_floor --rate 62500 --seconds 20 --commit-interval 0.02

    .venv/bin/python -m bench.latency_floor --rate 62500 --seconds 20 --commit-interval 0.02 \
        --delivery exactly_once

    .venv/bin/python -m bench.latency_floor --rate 62500 --seconds 20 --committers 1

    .venv/bin/python -m bench.latency_floor --rate 62500 --seconds 20 --committers 2 --rounds

The second commits each reader's rows at most every 20 ms, the interval the reducers of
:mod:`bench.latency` keep at this rate: what the commit cadence alone costs on the store.
The third also makes, per read with rows and per trim, the store transactions an
exactly-once mapper makes (:mod:`bench.floor_mapper_records`): what exactly-once delivery
costs on the store, before any shuffle. The fourth sends each read through one gRPC call to
a committer process that commits it (:mod:`bench.floor_hop`): the floor plus the one hop
between processes that any shuffle of mappers and reducers in separate processes has
(``--committers 2``: the rows split between two, as between two reducers). The fifth
commits as reducers in the default layout do, in rounds that wait for every reader's rows
(:data:`bench.floor_hop.ROUND_WAIT_SECONDS`): the hop's floor with a round's wait.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import millstream as ms
import numpy as np
import pyarrow as pa
from millstream.inputs import StoreQueue
from millstream.state import StoreTransaction

from bench import run_queue
from bench.floor_hop import HopClient, serve_commits
from bench.floor_mapper_records import MapperRecords
from bench.fresh_store import empty_store
from bench.latency_stats import save_append_times, summarize_latency
from bench.queue_pipeline import read_key_sums
from bench.queue_producer import QUEUE_NAME, QUEUE_PREFIX, ProducerHandle, ProducerPlan, Step

_WAIT_SECONDS = 0.01
"""The longest a reader at the end of its partition sleeps before it looks again (the
append's commit wakes it sooner), as a mapper's ``idle_seconds``."""


def _commit(txn: StoreTransaction, *, partition: int, sums: pa.Table, rows: int, end: int) -> None:
    """One read's transaction: its per-key sums, its row count, the position after it."""
    view = ms.Transaction(txn)
    view.add_many(("sum",), sums["key"].combine_chunks(), sums["value_sum"].combine_chunks())
    view.add(("rows", partition), rows)
    txn.set(("position", partition), str(end).encode())


def _read_and_commit(
    url: str,
    partitions: int,
    partition: int,
    trim_period: float,
    out: Path,
    stop: Event,
    commit_interval: float = 0.0,
    delivery: str = "at_least_once",
    records_synchronous: str = "full",
    committers: list[str] | None = None,
) -> None:
    """One partition's reader process: read, sum by key, commit; until the queue is sealed
    and read to its end (or ``stop``). Saves (append ns, rows, commit ns) per append.

    With a ``commit_interval``, the reads since the last commit are committed together, a
    commit at most every ``commit_interval`` from the start of the one before (as a
    reducer's cadence counts it): the store alone at a shuffle's commit rate. Exactly once,
    each read with rows and each trim also make an exactly-once mapper's transactions
    (:class:`MapperRecords`). With ``committers`` (their addresses), the commits are the
    committers' (:mod:`bench.floor_hop`), which save the times instead."""
    queue = StoreQueue(url, QUEUE_NAME, partitions, prefix=QUEUE_PREFIX)
    records = (
        MapperRecords(url, partition, synchronous=records_synchronous)
        if delivery == "exactly_once"
        else None
    )
    reader = queue.reader(partition)
    store = queue.store
    client = HopClient(committers) if committers else None
    position, token = 0, b""
    appends: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    commits: list[np.ndarray] = []
    trimmed_at = time.monotonic()
    gathered: list[pa.RecordBatch] = []
    last_commit = time.monotonic() - commit_interval
    ended = False
    while not stop.is_set() and not (ended and not gathered):
        result = reader.read(position, 0, token)
        batch = result.batch
        ended = result.end_of_input
        if batch is not None and batch.num_rows:
            if records is not None:
                records.plan(position, position + batch.num_rows)
            gathered.append(batch)
            position, token = position + batch.num_rows, result.continuation_token
        due = commit_interval - (time.monotonic() - last_commit)
        if not gathered or (due > 0 and not ended):
            if not ended:
                reader.wait_for_rows(position, due if gathered else _WAIT_SECONDS)
            continue
        table = pa.Table.from_batches(gathered)
        gathered = []
        last_commit = time.monotonic()
        if client is not None:
            client.commit(partition, table, position)
        else:
            stamps, counts = np.unique(
                table.column("append_ns").combine_chunks().to_numpy(), return_counts=True
            )
            sums = table.group_by("key", use_threads=False).aggregate([("value", "sum")])
            store.transact(
                functools.partial(
                    _commit, partition=partition, sums=sums, rows=table.num_rows, end=position
                )
            )
            committed = time.time_ns()
            appends.append(stamps)
            rows.append(counts)
            commits.append(np.full(stamps.size, committed, np.int64))
        if time.monotonic() - trimmed_at >= trim_period:
            if records is not None:
                records.persist(position, token)
            reader.trim(position, token)
            trimmed_at = time.monotonic()
    save_append_times(out, appends, rows, commits, [] if records is None else records.plan_seconds)
    if records is not None:
        records.close()
    if client is not None:
        client.close()
    queue.close()


def run(
    rate: float,
    seconds: float,
    *,
    warmup: float = 5.0,
    partitions: int = 2,
    keys: int = 100_000,
    spread: bool = False,
    trim_period: float = 0.25,
    tick: float = 0.01,
    store: str | None = None,
    commit_interval: float = 0.0,
    delivery: str = "at_least_once",
    records_synchronous: str = "full",
    committers: int = 0,
    rounds: bool = False,
) -> dict[str, Any]:
    """One run at ``rate`` rows/s for ``seconds``; latency (seconds) over the rows
    appended after the first ``warmup`` seconds, and the exactness check. A
    ``commit_interval`` makes each reader commit at most that often (0: every read);
    ``delivery="exactly_once"`` makes it also record each batch and persist its state as
    an exactly-once mapper does (:mod:`bench.floor_mapper_records`), with
    ``records_synchronous="normal"`` committed without an fsync of their own. ``committers``
    (0: none) split each read among that many committer processes that commit it
    (:mod:`bench.floor_hop`), with ``rounds`` each committer's calls from every reader
    together.

    ``store`` is a store URL to run on (``fdb://<cluster file>``, emptied first); by
    default an embedded SQLite file in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="millstream-floor-") as tmp:
        if store is None:
            url = f"sqlite:///{Path(tmp) / 'state.db'}"
        else:
            empty_store(store)
            url = store
        queue = StoreQueue(url, QUEUE_NAME, partitions, prefix=QUEUE_PREFIX)
        ctx = mp.get_context("forkserver")
        stop = ctx.Event()
        outs = [Path(tmp) / f"partition-{p}.npz" for p in range(partitions)]
        committer_processes = []
        addresses: list[str] = []
        for index in range(committers):
            outs.append(Path(tmp) / f"committer-{index}.npz")
            ready, port = ctx.Pipe()
            process = ctx.Process(
                target=serve_commits,
                args=(url, partitions, outs[-1], ready, stop, _commit, rounds),
                name=f"floor-committer-{index}",
                daemon=True,
            )
            process.start()
            committer_processes.append(process)
            addresses.append(f"127.0.0.1:{port.recv()}")
        readers = [
            ctx.Process(
                target=_read_and_commit,
                args=(
                    url,
                    partitions,
                    p,
                    trim_period,
                    outs[p],
                    stop,
                    commit_interval,
                    delivery,
                    records_synchronous,
                    addresses,
                ),
                name=f"floor-reader-{p}",
                daemon=True,
            )
            for p in range(partitions)
        ]
        for reader in readers:
            reader.start()
        plan = ProducerPlan(
            steps=(Step(seconds, rate),), tick_seconds=tick, keys=keys, spread=spread
        )
        producer = ProducerHandle(url, partitions, plan)
        processes = {f"reader {p}": r.pid for p, r in enumerate(readers) if r.pid is not None}
        processes["producer"] = producer.process.pid
        for index, process in enumerate(committer_processes):
            if process.pid is not None:
                processes[f"committer {index}"] = process.pid
        t0 = time.time()
        sched: list[tuple[float, dict[str, run_queue.Schedstat]]] = []
        try:
            while producer.poll(1.0) is None:
                if time.time() - t0 >= warmup:
                    sched[1:] = [(time.time(), run_queue.snapshot(processes))]
                    if len(sched) == 1:
                        sched.append(sched[0])
            produced = producer.result(timeout=seconds + 120)
            for reader in readers:
                reader.join(120)
        finally:
            stop.set()
            for process in committer_processes:
                process.join(60)
            for process in [*readers, *committer_processes]:
                if process.is_alive():
                    process.kill()
        if any(reader.exitcode != 0 for reader in readers):
            raise RuntimeError(f"a reader failed: exit codes {[r.exitcode for r in readers]}")
        if any(process.exitcode != 0 for process in committer_processes):
            codes = [process.exitcode for process in committer_processes]
            raise RuntimeError(f"a committer failed: exit codes {codes}")
        parts = [np.load(out) for out in outs]
        append_ns = np.concatenate([p["append_ns"] for p in parts])
        rows = np.concatenate([p["rows"] for p in parts])
        commit_ns = np.concatenate([p["commit_ns"] for p in parts])
        plan_seconds = np.concatenate([p["plan_seconds"] for p in parts])
        step = produced.steps[0]
        steady = (append_ns >= (step["start"] + warmup) * 1e9) & (append_ns <= step["end"] * 1e9)
        latency = summarize_latency((commit_ns - append_ns)[steady] / 1e9, rows[steady])
        store = queue.store
        txn = store.create_transaction()
        try:
            view = ms.Transaction(txn)
            committed = sum(view.get_int(("rows", p)) for p in range(partitions))
            sums, extra = read_key_sums(view, keys)  # last: see Pipeline.read_results
        finally:
            txn.reset()
        queue.close()
    exact = bool((sums == produced.sums).all()) and committed == produced.rows and extra == 0
    return {
        "rate": rate,
        "seconds": seconds,
        "spread": spread,
        "tick": tick,
        "commit_interval": commit_interval,
        "delivery": delivery,
        "records_synchronous": records_synchronous,
        "committers": committers,
        "rounds": rounds,
        # Commits: distinct commit times per process. Appends: distinct append stamps.
        "commits": sum(int(np.unique(part["commit_ns"]).size) for part in parts),
        "appends": int(np.unique(append_ns).size),
        "batches_planned": plan_seconds.size,
        "plan_ms": {
            q: float(np.percentile(plan_seconds, pct)) * 1000 if plan_seconds.size else 0.0
            for q, pct in (("p50", 50), ("p99", 99), ("max", 100))
        },
        "latency": latency,
        "producer_append_p99_ms": step["append"].get("p99_ms", float("nan")),
        "rows_appended": produced.rows,
        "rows_committed": committed,
        "exact": exact,
        "run_queue": (
            run_queue.waits(sched[0][1], sched[1][1], sched[1][0] - sched[0][0])
            if len(sched) == 2 and sched[1][0] > sched[0][0]
            else {}
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=62_500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="left out of the figures")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--trim-period", type=float, default=0.25)
    parser.add_argument("--tick", type=float, default=0.01, help="seconds between appends")
    parser.add_argument(
        "--spread", action="store_true", help="append to every partition every tick"
    )
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=0.0,
        help="commit the reads of this many seconds together (0: every read), as a "
        "reducer's cadence does: the store alone at a shuffle's commit rate",
    )
    parser.add_argument(
        "--delivery",
        choices=["at_least_once", "exactly_once"],
        default="at_least_once",
        help="exactly_once: each read with rows also records its batch, and each trim "
        "persists the reader's state, in the store transactions an exactly-once mapper makes",
    )
    parser.add_argument(
        "--what-if-records-synchronous",
        choices=["full", "normal"],
        default="full",
        dest="records_synchronous",
        help="exactly once, on the embedded store: normal commits the mapper's records "
        "without an fsync of their own (a what-if, not what the mapper does)",
    )
    parser.add_argument(
        "--committers",
        type=int,
        default=0,
        help="split each read by key among this many committer processes, one gRPC call "
        "to each, that commit it (0: each reader commits its own reads)",
    )
    parser.add_argument(
        "--rounds",
        action="store_true",
        help="with committers: each commits the calls of every reader together, as a "
        "round of the default layout does (bench.floor_hop.ROUND_WAIT_SECONDS at most)",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--store", default=None, metavar="URL", help="fdb://<cluster file> (emptied first)"
    )
    args = parser.parse_args(argv)
    print(
        "| rows/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | producer append p99 ms "
        "| batch records: count, p50 / p99 ms | exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for _ in range(args.runs):
        r = run(
            args.rate,
            args.seconds,
            warmup=args.warmup,
            partitions=args.partitions,
            spread=args.spread,
            trim_period=args.trim_period,
            tick=args.tick,
            store=args.store,
            commit_interval=args.commit_interval,
            delivery=args.delivery,
            records_synchronous=args.records_synchronous,
            committers=args.committers,
            rounds=args.rounds,
        )
        lat = r["latency"]
        figures = " | ".join(f"{lat[q] * 1000:.1f}" for q in ("p50", "p90", "p99", "p99.9", "max"))
        plan = r["plan_ms"]
        record = (
            f"{r['batches_planned']:,}, {plan['p50']:.1f} / {plan['p99']:.1f}"
            if r["batches_planned"]
            else "-"
        )
        print(
            f"| {args.rate:,.0f} | {figures} | {r['producer_append_p99_ms']:.1f} | {record} | "
            f"{'yes' if r['exact'] else 'NO'} |",
            flush=True,
        )
        if r["run_queue"]:
            print(f"processes (steady part): {run_queue.describe(r['run_queue'])}", flush=True)
        failed = failed or not r["exact"]
    if failed:
        raise SystemExit("a run was not exact: the committed sums differ from the producer's")


if __name__ == "__main__":
    main()
