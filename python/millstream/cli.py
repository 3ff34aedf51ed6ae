"""The ``millstream`` command: run a processor, or show a running one's status."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from millstream.exceptions import MillstreamError

if TYPE_CHECKING:
    from millstream.processor import Processor
    from millstream.state.records import Metric

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
        f"millstream: running {processor.name}: {processor.num_mappers} mappers, "
        f"{processor.num_reducers} reducers, store {processor.store}",
        file=sys.stderr,
    )
    from millstream.runner.local import RunStopped

    try:
        summary = processor.run_local(progress=not args.quiet, timeout=args.timeout)
    except RunStopped as stopped:
        if stopped.summary is not None:
            print(stopped.summary)
        return 128 + stopped.signum
    print(summary)
    return 0


def _rate(status: dict[str, Metric], what: str) -> float:
    uptime = float(status.get("uptime", 0) or 0)
    return float(status.get(what, 0) or 0) / uptime if uptime > 0 else 0.0


def _status(args: argparse.Namespace) -> int:
    from millstream.state import open_store
    from millstream.state.records import (
        freshest_workers,
        list_workers,
        read_mapper_state,
        read_processor_info,
        read_reducer_state,
        read_statuses,
    )

    store = open_store(args.store, prefix=(args.prefix,))
    txn = store.create_transaction()
    try:
        info = read_processor_info(txn)
        if info is None:
            print(f"no processor under prefix {args.prefix!r} in {args.store}")
            return 1
        statuses = read_statuses(txn)
        mappers = freshest_workers(list_workers(txn, "mapper"))
        reducers = freshest_workers(list_workers(txn, "reducer"))
        now = time.time()
        stale = 10 * args.heartbeat
        errors: list[str] = []
        print(f"processor {args.prefix}: {info.num_mappers} mappers, {info.num_reducers} reducers")
        print(
            f"{'mapper':>6} {'alive':>5} {'read':>12} {'persisted':>12} {'read lag':>10} "
            f"{'window rows':>12} {'window MB':>10} {'limit MB':>9} {'rows/s':>10}"
        )
        for m in range(info.num_mappers):
            state = read_mapper_state(txn, m)
            s = statuses.get(("mapper", m), {})
            alive = m in mappers and now - mappers[m].heartbeat < stale
            read = max(int(s.get("input_end_row_index", 0)), state.input_unread_row_index)
            print(
                f"{m:>6} {'yes' if alive else 'no':>5} {read:>12,} "
                f"{state.input_unread_row_index:>12,} {read - state.input_unread_row_index:>10,} "
                f"{int(s.get('window_rows', 0)):>12,} {int(s.get('window_bytes', 0)) / 1e6:>10.1f} "
                f"{int(s.get('memory_limit_bytes', 0)) / 1e6:>9.0f} {_rate(s, 'rows_read'):>10,.0f}"
            )
            if s.get("last_error"):
                errors.append(f"mapper {m}: {s['last_error']}")
        print(
            f"{'reducer':>7} {'alive':>5} {'commits':>9} {'rows':>12} {'rows/commit':>11} "
            f"{'rows/s':>10} {'MB/s':>7}  committed row indices"
        )
        for r in range(info.num_reducers):
            committed = read_reducer_state(txn, r, info.num_mappers).committed_row_indices
            s = statuses.get(("reducer", r), {})
            alive = r in reducers and now - reducers[r].heartbeat < stale
            commits, rows = int(s.get("commits", 0)), int(s.get("rows_reduced", 0))
            print(
                f"{r:>7} {'yes' if alive else 'no':>5} {commits:>9,} {rows:>12,} "
                f"{rows // max(1, commits):>11,} {_rate(s, 'rows_reduced'):>10,.0f} "
                f"{_rate(s, 'bytes_fetched') / 1e6:>7.1f}  {list(committed)}"
            )
            if s.get("last_error"):
                errors.append(f"reducer {r}: {s['last_error']}")
        for line in errors:
            print(f"last error of {line}")
    finally:
        txn.reset()
        store.close()
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
    run.set_defaults(func=_run)
    status = sub.add_parser("status", help="show a processor's workers, lag and windows")
    status.add_argument("store", help="store URL, e.g. sqlite:///tmp/state.db")
    status.add_argument("--prefix", default="millstream", help="the processor's name")
    status.add_argument(
        "--heartbeat",
        type=float,
        default=1.0,
        help="the processor's heartbeat period; workers silent for 10 periods show as down",
    )
    status.set_defaults(func=_status)
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
