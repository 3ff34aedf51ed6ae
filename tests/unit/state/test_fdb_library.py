"""The binding finds ``libfdb_c`` from ``$MILLSTREAM_FDB_HOME`` or the standard paths, and
says what to do when it cannot; ``fdb://`` opens the default cluster file.

Each case runs in a fresh interpreter: the library loads once per process, and the library
search path is read when a process starts. The environment is cleared of the search path,
so only millstream's own lookup can find the library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from millstream.state.fdb_backend import (
    BINDING_REQUIREMENT,
    FDB_API_VERSION,
    STANDARD_LIBRARY_PATHS,
)

OPEN_AND_WRITE = """
import sys
from millstream.exceptions import StoreUnavailableError
from millstream.state import open_store
try:
    store = open_store(sys.argv[1], prefix=("library-test",))
except StoreUnavailableError as exc:
    print(exc)
    raise SystemExit(3)
store.transact(lambda txn: txn.set(("k",), b"v"))
print(store.transact(lambda txn: txn.get(("k",))).decode())
store.transact(lambda txn: txn.clear_range_startswith(()))
"""


def _run(url: str, home: str | None, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FDB_CLUSTER_FILE")}
    env.pop("MILLSTREAM_FDB_HOME", None)
    if home is not None:
        env["MILLSTREAM_FDB_HOME"] = home
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", OPEN_AND_WRITE, url],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_a_home_without_the_library_names_both_versions_and_the_fix(tmp_path: Path) -> None:
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("test:test@127.0.0.1:4500\n")
    done = _run(f"fdb://{cluster}", str(tmp_path / "no-fdb-here"), tmp_path)
    assert done.returncode == 3, done.stderr
    message = done.stdout
    assert "libfdb_c not found" in message
    assert f"MILLSTREAM_FDB_HOME={tmp_path / 'no-fdb-here'} holds no lib/libfdb_c.so" in message
    binding = BINDING_REQUIREMENT.split("~=")[1].rsplit(".", 1)[0]
    assert f"the binding foundationdb {binding}." in message  # the binding's version
    assert f"needs libfdb_c 7.3 or newer (API version {FDB_API_VERSION})" in message
    assert "set MILLSTREAM_FDB_HOME to a FoundationDB folder" in message
    assert "github.com/apple/foundationdb/releases" in message


@pytest.mark.skipif(
    any(os.path.isfile(p) for p in STANDARD_LIBRARY_PATHS), reason="libfdb_c is installed here"
)
def test_without_a_home_or_an_installed_client_the_error_says_how_to_install(
    tmp_path: Path,
) -> None:
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("test:test@127.0.0.1:4500\n")
    done = _run(f"fdb://{cluster}", None, tmp_path)
    assert done.returncode == 3, done.stderr
    assert "libfdb_c not found" in done.stdout
    assert f"API version {FDB_API_VERSION}" in done.stdout
    assert "foundationdb-clients" in done.stdout


@pytest.mark.fdb
def test_the_library_loads_from_the_home_without_the_search_path(
    fdb_url: str, tmp_path: Path
) -> None:
    done = _run(fdb_url, os.environ.get("MILLSTREAM_FDB_HOME"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "v"


@pytest.mark.fdb
def test_fdb_url_without_a_path_opens_the_default_cluster_file(
    fdb_url: str, tmp_path: Path
) -> None:
    """``fdb://`` is the client's default cluster file: ``$FDB_CLUSTER_FILE``, then
    ``./fdb.cluster`` (then ``/etc/foundationdb/fdb.cluster``)."""
    cluster_file = fdb_url.removeprefix("fdb://")
    home = os.environ.get("MILLSTREAM_FDB_HOME")
    by_variable = _run("fdb://", home, tmp_path, FDB_CLUSTER_FILE=cluster_file)
    assert by_variable.returncode == 0, by_variable.stdout + by_variable.stderr
    assert by_variable.stdout.strip() == "v"
    shutil.copy(cluster_file, tmp_path / "fdb.cluster")
    in_cwd = _run("fdb://", home, tmp_path)
    assert in_cwd.returncode == 0, in_cwd.stdout + in_cwd.stderr
    assert in_cwd.stdout.strip() == "v"
