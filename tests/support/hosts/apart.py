"""A call in an interpreter of its own, for runs whose store is FoundationDB on a host.

FoundationDB's client runs one network thread per process, in the network namespace of the
thread that first opened a database, for the life of the process. A run with the store on
a host of its own reads it from inside another host (the driver's), so it needs a process
that has not opened a database yet (a test session opens its own cluster from this
machine's network), and one per run (each run's hosts are new namespaces):

    result = call_apart(run_spark_cut, directory, seed, store="fdb")

runs ``run_spark_cut(directory, seed, store="fdb")`` in ``python -m
tests.support.hosts.apart`` and returns its result, or raises with the child's traceback.
The child's output goes to this process's. A child that outlives ``timeout`` gets SIGTERM
(it raises ``SystemExit``, so that its clusters close), then SIGKILL; its namespaces, and
whatever still runs in them, are removed either way
(:func:`~tests.support.hosts.cluster.remove_stale`).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.support.hosts.cluster import remove_stale

ROOT = Path(__file__).resolve().parents[3]
"""The repository's root: the test jobs import from it."""

T = TypeVar("T")

_TERM_SECONDS = 60.0
"""How long a child given SIGTERM has to close its clusters before it is killed."""


def python_path() -> str:
    """This process's ``PYTHONPATH`` with the repository root first (the test jobs)."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(paths))


def call_apart(function: Callable[..., T], /, *args: Any, timeout: float, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` in a fresh interpreter; its result.

    ``function``, the arguments and the result must pickle: ``function`` by a name the
    child can import (a module's function, not ``__main__``'s).

    Raises:
        AssertionError: The call raised (with the child's traceback), the child died
            without a result, or it did not return within ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory(prefix="millstream-apart-") as directory:
        call, answer = Path(directory) / "call.pickle", Path(directory) / "answer.pickle"
        call.write_bytes(pickle.dumps((function, args, kwargs)))
        argv = [sys.executable, "-m", "tests.support.hosts.apart", str(call), str(answer)]
        env = {**os.environ, "PYTHONPATH": python_path()}
        child = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(_TERM_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise AssertionError(
                f"{function.__name__} did not return within {timeout:.0f}s"
            ) from None
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            remove_stale()
        if not answer.exists():
            raise AssertionError(f"{function.__name__} died with {child.returncode}: no result")
        ok, value = pickle.loads(answer.read_bytes())
    if not ok:
        raise AssertionError(f"{function.__name__} failed in its own interpreter:\n{value}")
    return value  # type: ignore[no-any-return]


def main(call: str, answer: str) -> int:
    """Run the pickled call; pickle ``(True, result)`` or ``(False, traceback)``."""

    def stop(*_: object) -> None:
        raise SystemExit("stopped: the caller's timeout")

    signal.signal(signal.SIGTERM, stop)
    try:
        function, args, kwargs = pickle.loads(Path(call).read_bytes())
        outcome: tuple[bool, Any] = (True, function(*args, **kwargs))
    except BaseException:
        outcome = (False, traceback.format_exc())
    Path(answer).write_bytes(pickle.dumps(outcome))
    return 0 if outcome[0] else 1


if __name__ == "__main__":
    import millstream  # noqa: F401  (before grpc: it turns gRPC's fork handlers off)

    sys.exit(main(*sys.argv[1:]))
