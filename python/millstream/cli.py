"""The ``millstream`` command: run a processor, show a running one's status or its dead
letters, or serve the metrics its workers write."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from millstream.exceptions import ConfigurationError, MillstreamError

if TYPE_CHECKING:
    from millstream.processor import Processor

# The heavy modules (pyarrow, gRPC, the store) are imported inside the commands: ``run``
# starts the fork server first, so that its imports overlap this process's.


def load_processor(reference: str) -> Processor:
    """Return the processor named by ``module:attribute`` or ``path/to/job.py:attribute``.

    A file is loaded as a script: its directory goes first on ``sys.path`` (as with
    ``python job.py``), it runs under its file name (not as ``__main__``, so a main guard
    keeps the job from starting during the load), and workers get its classes by value,
    never importing it again.
    """
    from millstream.processor import Processor

    module_name, _, attribute = reference.rpartition(":")
    if not module_name or not attribute:
        raise MillstreamError(
            f"expected <module>:<processor> or <file.py>:<processor>, got {reference!r}"
        )
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        module = _load_script(Path(module_name))
    else:
        if "" not in sys.path:
            sys.path.insert(0, "")
        module = importlib.import_module(module_name)
    processor = getattr(module, attribute, None)
    if not isinstance(processor, Processor):
        raise MillstreamError(f"{reference} is not a millstream.Processor (got {processor!r})")
    return processor


def _load_script(path: Path) -> ModuleType:
    import cloudpickle

    from millstream.runner.forkserver import register_script

    if not path.is_file():
        raise MillstreamError(f"no such file: {path} (give <file.py>:<processor>)")
    path = path.resolve()
    name = path.stem
    if not name.isidentifier() or name in sys.modules:
        name = "_millstream_script_" + "".join(c if c.isalnum() else "_" for c in name)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MillstreamError(f"cannot load {path} as Python source")
    sys.path.insert(0, str(path.parent))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    register_script(name)
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def _run(args: argparse.Namespace) -> int:
    from millstream.runner.forkserver import start_fork_server

    start_fork_server()  # it imports millstream and pyarrow while the user's module loads
    processor = load_processor(args.processor)
    print(
        f"millstream: running {processor.name}: {processor.num_mappers} mappers over "
        f"{processor.num_partitions} partitions, "
        f"{processor.num_reducers} reducers, store {processor.store}",
        file=sys.stderr,
    )
    from millstream.runner.local import run_local
    from millstream.runner.signals import RunStopped

    try:
        summary = run_local(
            processor,
            progress=not args.quiet,
            timeout=args.timeout,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
        )
    except RunStopped as stopped:
        if stopped.summary is not None:
            print(stopped.summary)
        return 128 + stopped.signum
    print(summary)
    return 0


def _rescale(args: argparse.Namespace) -> int:
    import dataclasses

    from millstream.runner.forkserver import start_fork_server

    start_fork_server()
    processor = dataclasses.replace(load_processor(args.processor), num_reducers=args.reducers)
    from millstream.runner.rescaler import rescale
    from millstream.runner.signals import RunStopped

    try:
        summary = rescale(processor, progress=not args.quiet, timeout=args.timeout)
    except RunStopped as stopped:
        print("millstream: rescale stopped; run it again to finish it", file=sys.stderr)
        return 128 + stopped.signum
    print(summary)
    return 0


def _metrics(args: argparse.Namespace) -> int:
    import signal
    import threading

    from millstream.runner.metrics_server import MetricsServer

    directory = Path(args.directory)
    if not directory.is_dir():
        raise MillstreamError(
            f"no such directory: {directory}. Give the PROMETHEUS_MULTIPROC_DIR the workers "
            "write their metrics into"
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = MetricsServer(args.port, dict, directory=str(directory), host=args.host)
    print(
        f"millstream: serving the metrics in {directory} on {server.url}",
        file=sys.stderr,
        flush=True,
    )
    try:
        stop.wait()
    finally:
        server.close()
    return 0


def collect_status(
    store_url: str,
    prefix: str,
    heartbeat: float = 1.0,
    kafka: tuple[str, str] | None = None,
) -> dict[str, Any] | None:
    """A processor's status as plain data (what ``status --json`` prints); None if the
    store holds no processor under ``prefix``. See :func:`millstream.ledger.read_status`.

    With ``kafka=(bootstrap_servers, topic)``, the processor's input: each mapper's
    ``lag_rows`` is the offsets between its persisted position and its partition's last
    stable offset (see :mod:`millstream.inputs.kafka_lag`), with ``kafka_next_offset`` and
    ``kafka_end_offset``.
    """
    from millstream.ledger import read_status
    from millstream.ledger.mapper import read_mapper_state
    from millstream.state import open_store

    store = open_store(store_url, prefix=(prefix,))
    try:
        with store.read() as txn:
            status = read_status(txn, prefix, heartbeat)
            if status is None or kafka is None:
                return status
            tokens = {
                m: read_mapper_state(txn, m).continuation_token
                for m in range(status["num_partitions"])
            }
    finally:
        store.close()
    from millstream.inputs.kafka_lag import kafka_lag

    lags = kafka_lag(*kafka, tokens)
    for mapper in status["mappers"]:
        lag = lags[mapper["index"]]
        mapper["lag_rows"] = lag.lag
        mapper["kafka_next_offset"] = lag.next_offset
        mapper["kafka_end_offset"] = lag.end_offset
        rate = mapper["rows_per_second"]
        mapper["lag_seconds"] = 0.0 if lag.lag == 0 else (lag.lag / rate if rate else None)
    return status


def _optional(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_status(status: dict[str, Any]) -> str:
    """The human-readable table of :func:`collect_status`."""
    lines = [
        f"processor {status['processor']}: {status['num_partitions']} input partitions, "
        f"{status['num_reducers']} reducers",
        f"{'part.':>6} {'alive':>5} {'read':>12} {'persisted':>12} {'lag rows':>10} "
        f"{'lag s':>7} {'rows/s':>10} {'window rows':>12} {'window MB':>10} {'limit MB':>9}",
    ]
    errors = []
    for m in status["mappers"]:
        lines.append(
            f"{m['index']:>6} {'yes' if m['alive'] else 'no':>5} {m['rows_read']:>12,} "
            f"{m['rows_persisted']:>12,} {_optional(m['lag_rows'], ',d'):>10} "
            f"{_optional(m['lag_seconds'], '.1f'):>7} {m['rows_per_second']:>10,.0f} "
            f"{m['window_rows']:>12,} {m['window_bytes'] / 1e6:>10.1f} "
            f"{m['memory_limit_bytes'] / 1e6:>9.0f}"
        )
        if m["last_error"]:
            errors.append(f"mapper {m['index']}: {m['last_error']}")
    lines.append(
        f"{'reducer':>7} {'alive':>5} {'commits':>9} {'rows':>12} {'rows/commit':>11} "
        f"{'rows/s':>10} {'MB/s':>7} {'last commit':>11} {'store':>5} {'reduce':>6} "
        f"{'wait':>5}  committed row indices"
    )
    for r in status["reducers"]:
        since = r["seconds_since_commit"]
        shares = r["time_shares"]
        lines.append(
            f"{r['index']:>7} {'yes' if r['alive'] else 'no':>5} {r['commits']:>9,} "
            f"{r['rows_reduced']:>12,} {r['rows_reduced'] // max(1, r['commits']):>11,} "
            f"{r['rows_per_second']:>10,.0f} {r['bytes_per_second'] / 1e6:>7.1f} "
            f"{_optional(since, '.1f') + (' s ago' if since is not None else ''):>11} "
            f"{shares['store']:>5.0%} {shares['reduce']:>6.0%} {shares['mapper_wait']:>5.0%}  "
            f"{r['committed_row_indices']}"
        )
        if r["last_error"]:
            errors.append(f"reducer {r['index']}: {r['last_error']}")
    late = [r.get("late_rows") for r in status["reducers"] if r.get("late_rows") is not None]
    if late:
        lines.append(f"late rows (their pane was emitted already): {sum(late):,}")
    lines.extend(f"last error of {line}" for line in errors)
    if status["dead_letters"]:
        lines.append(
            f"{status['dead_letters']:,} dead letters "
            f"(map: {sum(m['dead_letters'] for m in status['mappers']):,}, "
            f"reduce: {sum(r['dead_letters'] for r in status['reducers']):,}); "
            "list them with `millstream dead-letters`"
        )
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    while True:
        if (args.kafka_bootstrap is None) != (args.kafka_topic is None):
            raise ConfigurationError("give both --kafka-bootstrap and --kafka-topic, or neither")
        kafka = None if args.kafka_topic is None else (args.kafka_bootstrap, args.kafka_topic)
        status = collect_status(args.store, args.prefix, args.heartbeat, kafka)
        if status is None:
            print(f"no processor under prefix {args.prefix!r} in {args.store}")
            return 1
        if args.json:
            print(json.dumps(status), flush=True)
        else:
            if args.watch:
                print("\033[H\033[J", end="")  # clear the terminal
            print(render_status(status), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _dead_letters(args: argparse.Namespace) -> int:
    from millstream.ledger import read_processor_info
    from millstream.ledger.dead_letters import read_dead_letters
    from millstream.state import open_store

    if args.limit < 0:
        raise MillstreamError(f"--limit must be 0 (all) or more, got {args.limit}")
    store = open_store(args.store, prefix=(args.prefix,))
    try:
        with store.read() as txn:
            if read_processor_info(txn) is None:
                print(f"no processor under prefix {args.prefix!r} in {args.store}")
                return 1
            letters = read_dead_letters(txn, args.stage, limit=args.limit)
    finally:
        store.close()
    for letter in letters:
        record = {
            "stage": letter.stage,
            "partition": letter.partition,
            "index": letter.index,
            "position": letter.position,
            "reducer": letter.reducer,
            "error": letter.error,
            "row": letter.row.to_pylist()[0],
        }
        if args.json:
            print(json.dumps(record, default=str))
            continue
        where = (
            f"input row {letter.index}"
            if letter.stage == "map"
            else f"reducer {letter.reducer}, row {letter.position} of the fetch from "
            f"shuffle index {letter.index}"
        )
        print(
            f"{letter.stage} partition {letter.partition} {where}: {record['row']}\n"
            f"    {letter.error}"
        )
    if not args.json:
        print(f"{len(letters)} dead letters", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``millstream`` command."""
    parser = argparse.ArgumentParser(prog="millstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a processor on this machine until its input drains")
    run.add_argument(
        "processor", help="module:attribute or file.py:attribute of a millstream.Processor"
    )
    run.add_argument("--timeout", type=float, default=None, help="give up after seconds")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics of every worker at http://<host>:PORT/metrics",
    )
    run.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics listen on (default 127.0.0.1; 0.0.0.0: every interface)",
    )
    run.set_defaults(func=_run)
    rescale = sub.add_parser(
        "rescale",
        help="change a stopped processor's number of reducers, losing and repeating no row",
    )
    rescale.add_argument(
        "processor", help="module:attribute or file.py:attribute of a millstream.Processor"
    )
    rescale.add_argument(
        "--reducers", type=int, required=True, help="the number of reducers after the rescale"
    )
    rescale.add_argument("--timeout", type=float, default=None, help="give up after seconds")
    rescale.add_argument("--quiet", action="store_true", help="no progress lines")
    rescale.set_defaults(func=_rescale)
    metrics = sub.add_parser(
        "metrics",
        help="serve the Prometheus metrics workers write into a directory (Spark executors)",
    )
    metrics.add_argument("directory", help="the workers' PROMETHEUS_MULTIPROC_DIR")
    metrics.add_argument("--port", type=int, required=True, help="TCP port (0: a free one)")
    metrics.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)",
    )
    metrics.set_defaults(func=_metrics)
    status = sub.add_parser("status", help="show a processor's workers, lag and windows")
    status.add_argument("store", help="store URL, e.g. sqlite:///tmp/state.db")
    status.add_argument("--prefix", default="millstream", help="the processor's name")
    status.add_argument(
        "--heartbeat",
        type=float,
        default=1.0,
        help="the processor's heartbeat period; workers silent for 10 periods show as down",
    )
    status.add_argument("--json", action="store_true", help="one JSON object per refresh")
    status.add_argument(
        "--kafka-bootstrap", metavar="ADDR", help="the brokers of the processor's Kafka input"
    )
    status.add_argument(
        "--kafka-topic",
        metavar="TOPIC",
        help="the processor's input topic: lag is the offsets up to each partition's end",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until interrupted",
    )
    status.set_defaults(func=_status)
    dead = sub.add_parser(
        "dead-letters",
        help="list the rows map or reduce raised on (Tuning(on_user_error='dead_letter'))",
    )
    dead.add_argument("store", help="store URL, e.g. sqlite:///tmp/state.db")
    dead.add_argument("--prefix", default="millstream", help="the processor's name")
    dead.add_argument("--stage", choices=("map", "reduce"), help="only this stage's")
    dead.add_argument("--limit", type=int, default=0, help="at most this many (0: all)")
    dead.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    dead.set_defaults(func=_dead_letters)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except MillstreamError as exc:
        print(f"millstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
