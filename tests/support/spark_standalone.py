"""A Spark standalone cluster on this machine: a master and workers on their own addresses.

The master listens on 127.0.0.1 and every worker on an address of its own (127.0.0.2,
127.0.0.3, ...: all of ``127.0.0.0/8`` reaches this machine's loopback interface on Linux,
nothing leaves it). A worker is started with ``SPARK_LOCAL_IP`` set to its address, as a
real host would be configured, so its executors and their Python workers know their host.
Everything runs from the installed ``pyspark`` package (``bin/spark-class``); every process
is started in a session of its own and killed by its process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MASTER_HOST = "127.0.0.1"


def require_spark() -> None:
    """Skip the calling test unless pyspark and a JDK are installed (``make test`` installs
    both)."""
    pytest.importorskip("pyspark")
    java = os.environ.get("JAVA_HOME") or any(
        (Path(p) / "java").exists() for p in os.environ.get("PATH", "").split(os.pathsep)
    )
    if not java:
        pytest.skip("no JDK: run scripts/install-system-deps.sh")


def check_bindable(host: str) -> None:
    """Fail with what to do when this machine cannot listen on ``host``."""
    try:
        with socket.socket() as s:
            s.bind((host, 0))
    except OSError as exc:
        raise RuntimeError(
            f"cannot listen on {host} ({exc}): the standalone-cluster tests give each Spark "
            f"worker its own loopback address. Linux routes all of 127.0.0.0/8 to the "
            f"loopback interface; elsewhere add an alias (macOS: sudo ifconfig lo0 alias "
            f"{host})"
        ) from exc


def free_port(host: str = MASTER_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def executor_address(pid: int) -> str:
    """The ``SPARK_LOCAL_IP`` of a worker process's executor (its environment)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SPARK_LOCAL_IP=")]
    assert found, f"process {pid} has no SPARK_LOCAL_IP"
    return found[0]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class Process:
    """A started JVM (its own process group) and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL the whole group: the JVM and every process it started (executors)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class StandaloneCluster:
    """A master and workers started by :meth:`start`; :meth:`stop` kills them all.

    Attributes:
        root: Logs and work directories.
        cores: Cores each worker offers.
        master_host: The address the master listens on.
        daemon_options: Java options of the master and the workers
            (``SPARK_DAEMON_JAVA_OPTS``), e.g. ``-Dspark.worker.timeout=5``.
    """

    root: Path
    cores: int = 2
    memory: str = "1g"
    master_host: str = MASTER_HOST
    daemon_options: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    master: Process | None = None
    workers: dict[str, Process] = field(default_factory=dict)
    _started: list[Process] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://{self.master_host}:{self.port}"

    def _environ(self, host: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=host,
            SPARK_LOCAL_HOSTNAME=host,
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_NO_DAEMONIZE="1",
            SPARK_DAEMON_JAVA_OPTS=" ".join(self.daemon_options),
        )
        return env

    def launch(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` (here: this machine's own network)."""
        return argv

    def _spawn(self, name: str, host: str, *args: str) -> Process:
        log = self.root / f"{name}-{len(self._started)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            popen = subprocess.Popen(
                self.launch(host, [str(spark_home() / "bin" / "spark-class"), *args]),
                env=self._environ(host),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        process = Process(name, popen, log)
        self._started.append(process)
        return process

    def start(self, hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3")) -> None:
        """Start the master and one worker per host, and wait until all are registered."""
        for host in hosts:
            check_bindable(host)
        self.master = self._spawn(
            "master",
            self.master_host,
            "org.apache.spark.deploy.master.Master",
            "--host",
            self.master_host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for host in hosts:
            self.start_worker(host, wait=False)
        self.wait_for_workers(len(hosts))

    def start_worker(self, host: str, *, wait: bool = True) -> None:
        """Start (again) the worker on ``host``."""
        alive = len(self.alive_workers()) if wait else 0
        work = self.root / f"work-{host}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers[host] = self._spawn(
            f"worker-{host}",
            host,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            host,
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(work),
            "--webui-port",
            str(free_port(host)),
            self.url,
        )
        if wait:
            self.wait_for_workers(alive + 1)

    def kill_worker(self, host: str) -> None:
        """SIGKILL the worker on ``host`` with its executors (the executor is lost)."""
        self.workers.pop(host).kill()

    def state(self) -> dict[str, Any]:
        """The master's JSON status page."""
        url = f"http://{self.master_host}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> list[str]:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):  # not listening yet, or a page half written
            return []
        return [w["host"] for w in workers if w.get("state") == "ALIVE"]

    def wait_for_workers(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.alive_workers()) >= count:
                return
            for process in self._started:
                if process.popen.poll() is not None and process in self.running():
                    raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
            time.sleep(0.2)
        logs = "\n".join(f"--- {p.name}\n{p.tail(10)}" for p in self.running())
        raise RuntimeError(f"{count} Spark workers did not register in {timeout} s\n{logs}")

    def running(self) -> list[Process]:
        return [p for p in [self.master, *self.workers.values()] if p is not None]

    def stop(self) -> None:
        """Kill every process group this cluster started."""
        for process in reversed(self._started):
            process.kill()


def spark_submit(
    script: Path, args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` through the package's ``bin/spark-submit`` with this interpreter.

    Every JVM and Python process it starts stays on loopback (``SPARK_LOCAL_IP``).
    """
    environ = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": MASTER_HOST,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(
        [str(spark_home() / "bin" / "spark-submit"), *args, str(script)],
        env=environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
