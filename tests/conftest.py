"""Session-wide setup: the FoundationDB cluster, hypothesis's profile, small examples.

The repository root is importable (``pythonpath`` in ``pyproject.toml``): the examples and
the tests' helpers, ``tests.support``. Worker processes are spawned and unpickle the user's
classes by module path; spawn hands the parent's ``sys.path`` to every child, so what is
importable here is importable there.
The examples generate their input when imported: point them at a small input under a
temporary directory so importing them in tests never writes the full-size data.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import millstream  # noqa: F401  (before any grpc import: it turns gRPC's fork handlers off)
import pytest
from hypothesis import settings

from tests.support.fdb_cluster import REQUIRE_VARIABLE, FdbBinaries, find_binaries, start_cluster

ROOT = Path(__file__).resolve().parent.parent

# No per-example time limit: the tests assert behaviour, not speed, and a loaded 2-core
# machine (a first call that imports, a Rust build beside the suite) can take longer than
# hypothesis's 200 ms default for reasons that have nothing to do with the code.
settings.register_profile("millstream", deadline=None)
settings.load_profile("millstream")

os.environ.setdefault("MILLSTREAM_EXAMPLE_ROWS", "20000")
os.environ.setdefault("MILLSTREAM_EXAMPLE_DIR", tempfile.mkdtemp(prefix="millstream-examples-"))

# -- FoundationDB ------------------------------------------------------------------------
# One cluster per session, from $MILLSTREAM_FDB_HOME (default ../shared/fdb beside the
# repository) or the standard install paths; tests marked ``fdb`` use it through
# ``fdb_url`` (or start their own from ``fdb_binaries``). Without binaries they skip with
# one reason; with MILLSTREAM_REQUIRE_FDB=1 (CI) a skipped ``fdb`` test fails instead.

FDB_BINARIES, FDB_MISSING = find_binaries(ROOT)
EXTERNAL_CLUSTER_FILE = os.environ.get("MILLSTREAM_FDB_CLUSTER_FILE")
"""A running cluster to use instead of starting one (its cluster file)."""


@pytest.fixture(scope="session")
def fdb_binaries() -> FdbBinaries:
    """The FoundationDB binaries; skips the test when there are none."""
    if FDB_BINARIES is None:
        pytest.skip(FDB_MISSING)
    return FDB_BINARIES


@pytest.fixture(scope="session")
def fdb_url() -> Iterator[str]:
    """The store URL of the session's FoundationDB cluster (``fdb://<cluster file>``),
    started on first use and stopped, its directory removed, when the session ends."""
    if EXTERNAL_CLUSTER_FILE:
        yield f"fdb://{EXTERNAL_CLUSTER_FILE}"
        return
    if FDB_BINARIES is None:
        pytest.skip(FDB_MISSING)
    cluster = start_cluster(FDB_BINARIES)
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under MILLSTREAM_REQUIRE_FDB=1, a skipped FoundationDB test is a failure."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and os.environ.get(REQUIRE_VARIABLE) == "1"
        and item.get_closest_marker("fdb") is not None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"FoundationDB test skipped under {REQUIRE_VARIABLE}=1: {reason}"
