"""A one-process FoundationDB cluster for the tests: found, started, killed, restarted, stopped.

The binaries come from ``$MILLSTREAM_FDB_HOME`` (``bin/fdbserver``, ``bin/fdbcli``,
``lib/libfdb_c.so``: a FoundationDB folder, such as the one built beside the repository
in ``../shared/fdb``), else from FoundationDB's standard install paths. The cluster listens on
a free loopback port (or on a host of its own, :mod:`tests.support.hosts.cluster`) and keeps
its cluster file, data and logs in a temporary directory, removed when it stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HOME_VARIABLE = "MILLSTREAM_FDB_HOME"
REQUIRE_VARIABLE = "MILLSTREAM_REQUIRE_FDB"
"""Set to 1 (CI does) to fail, not skip, the FoundationDB tests when no binaries are found."""

STANDARD_PATHS = {
    "fdbserver": Path("/usr/sbin/fdbserver"),
    "fdbcli": Path("/usr/bin/fdbcli"),
    "libfdb_c": Path("/usr/lib/libfdb_c.so"),
}
READY_SECONDS = 60.0


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class FdbBinaries:
    """Where the server, the command-line client and the client library are."""

    fdbserver: Path
    fdbcli: Path
    lib_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """The environment the server and ``fdbcli`` run in (the library folder on the path:
        a build from source links libraries that sit beside ``libfdb_c``)."""
        env = dict(os.environ)
        paths = [str(self.lib_dir), *filter(None, [env.get("LD_LIBRARY_PATH")])]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
        return env


def find_binaries(repo_root: Path) -> tuple[FdbBinaries | None, str]:
    """The binaries to use, or ``None`` and why there are none.

    Sets ``$MILLSTREAM_FDB_HOME`` to ``<repo>/../shared/fdb`` when that is unset and the
    folder exists, so that millstream (in this process and in every worker it spawns) loads
    the same ``libfdb_c``.
    """
    home = os.environ.get(HOME_VARIABLE)
    if not home and (repo_root.parent / "shared" / "fdb" / "bin" / "fdbserver").is_file():
        home = str((repo_root.parent / "shared" / "fdb").resolve())
        os.environ[HOME_VARIABLE] = home
    if home:
        root = Path(home)
        found = FdbBinaries(root / "bin" / "fdbserver", root / "bin" / "fdbcli", root / "lib")
        wanted = [found.fdbserver, found.fdbcli, found.lib_dir / "libfdb_c.so"]
    else:
        found = FdbBinaries(
            STANDARD_PATHS["fdbserver"], STANDARD_PATHS["fdbcli"], STANDARD_PATHS["libfdb_c"].parent
        )
        wanted = list(STANDARD_PATHS.values())
    missing = [str(p) for p in wanted if not p.is_file()]
    if missing:
        where = f"{HOME_VARIABLE}={home}" if home else "the standard install paths"
        return None, (
            f"FoundationDB tests need its binaries; {where} lacks {', '.join(missing)}. Set "
            f"{HOME_VARIABLE} to a FoundationDB folder (bin/fdbserver, bin/fdbcli, "
            "lib/libfdb_c.so) or install FoundationDB's server and client packages"
        )
    return found, ""


def _here(argv: Sequence[str]) -> list[str]:
    return list(argv)


class FdbCluster:
    """A one-process cluster on ``127.0.0.1:<free port>`` in a temporary directory.

    Args:
        binaries: The server and client to run.
        engine: The storage engine (``memory`` or ``ssd``).
        host: Listen on this address and port instead (a host's own network, whose ports
            are all free).
        launch: Wraps the server's and ``fdbcli``'s command lines (to run them inside a
            host's network: :meth:`tests.support.hosts.cluster.Host.exec_args`).
        directory: The cluster's folder (created; removed by :meth:`stop`) instead of a
            new temporary one.
    """

    def __init__(
        self,
        binaries: FdbBinaries,
        engine: str = "memory",
        *,
        host: tuple[str, int] | None = None,
        launch: Callable[[Sequence[str]], list[str]] = _here,
        directory: Path | None = None,
    ) -> None:
        self.binaries = binaries
        self.engine = engine
        self.launch = launch
        self.dir = directory or Path(tempfile.mkdtemp(prefix="millstream-fdb-"))
        ip, self.port = host or ("127.0.0.1", free_port())
        self.address = f"{ip}:{self.port}"
        self.cluster_file = self.dir / "fdb.cluster"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster_file.write_text(
            f"test{uuid.uuid4().hex[:8]}:c{uuid.uuid4().hex[:8]}@{self.address}\n"
        )
        (self.dir / "data").mkdir()
        (self.dir / "logs").mkdir()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The store URL of this cluster."""
        return f"fdb://{self.cluster_file}"

    def start(self) -> None:
        """Start the server, configure a new single-replica database, wait until available."""
        self._spawn()
        self.cli(f"configure new single {self.engine}", timeout=30)
        self.wait_available()

    def _spawn(self) -> None:
        log = open(self.dir / "logs" / "fdbserver.out", "ab")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            self.launch(
                [
                    str(self.binaries.fdbserver),
                    "-C",
                    str(self.cluster_file),
                    "-p",
                    self.address,
                    "-l",
                    self.address,
                    "-d",
                    str(self.dir / "data"),
                    "-L",
                    str(self.dir / "logs"),
                    "--knob_disable_posix_kernel_aio=1",
                ]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.binaries.env,
        )
        log.close()

    def cli(self, command: str, timeout: float = 10) -> str:
        """Run one ``fdbcli`` command against the cluster; its output."""
        done = subprocess.run(
            self.launch(
                [
                    str(self.binaries.fdbcli),
                    "-C",
                    str(self.cluster_file),
                    "--timeout",
                    str(int(timeout)),
                    "--exec",
                    command,
                ]
            ),
            capture_output=True,
            text=True,
            env=self.binaries.env,
            timeout=timeout + 30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"fdbcli {command!r} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def wait_available(self) -> None:
        """Return once the database serves reads and writes (``status minimal``)."""
        deadline = time.monotonic() + READY_SECONDS
        last = ""
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"fdbserver exited with {self.process.returncode}; see {self.dir}/logs"
                )
            try:
                last = self.cli("status minimal", timeout=5)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                last = str(exc)
            if "The database is available" in last:
                return
            time.sleep(0.2)
        raise RuntimeError(f"FoundationDB at {self.address} did not become available: {last}")

    def kill(self) -> None:
        """SIGKILL the server (what a crashed machine does); its data stays on disk."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def restart(self) -> None:
        """Start the server again on the same port and data, and wait until available."""
        self._spawn()
        self.wait_available()

    def stop(self) -> None:
        """Stop the server and remove the directory: nothing is left behind."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_cluster(
    binaries: FdbBinaries,
    engine: str = "memory",
    *,
    host: tuple[str, int] | None = None,
    launch: Callable[[Sequence[str]], list[str]] = _here,
    directory: Path | None = None,
) -> FdbCluster:
    """A started cluster (arguments as :class:`FdbCluster`'s); stopped (and its directory
    removed) if starting fails."""
    cluster = FdbCluster(binaries, engine, host=host, launch=launch, directory=directory)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
