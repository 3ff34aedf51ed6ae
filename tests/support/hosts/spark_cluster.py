"""A Spark standalone cluster across hosts with networks of their own.

Host 0 of a :class:`~tests.support.hosts.cluster.Cluster` runs the Spark master and the
driver (:func:`start_driver`: a Python process started inside that host, as a driver on a
host of its own would be; the test process only reads the store), and every other host
but the store's runs a Spark worker, started with ``SPARK_LOCAL_IP`` and
``SPARK_LOCAL_HOSTNAME`` set to the host's address, so that its executors, their Python
workers and the mappers in them bind and advertise that address. GetRows crosses the
hosts' links over mutual TLS.

The store is either SQLite, a file every host shares (namespaces cut networks, not the file
system), so the run is ``single_host`` as far as the store goes; or FoundationDB on a host
of its own (``store_host``), which every worker reaches over its links, and the run is not
``single_host``: the driver's checks (:func:`millstream.spark.hosts.check_deployment`) pass
because the store is one every host reaches and the master is on a loopback address, as on
a real cluster whose workers advertise the addresses the others reach. Timeouts are short
so that a worker cut from the driver is noticed within seconds (:data:`SPARK_CONF`,
:data:`DAEMON_OPTIONS`). Every process runs inside a host:
:meth:`Cluster.close <tests.support.hosts.cluster.Cluster.close>` kills whatever a failed
test left there.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import millstream as ms
from millstream.state.fdb_backend import HOME_VARIABLE

from tests.support.hosts.apart import ROOT, python_path
from tests.support.hosts.cluster import Cluster, Host, inside
from tests.support.spark_standalone import Process, StandaloneCluster, spark_home

HEARTBEAT_SECONDS = 1
"""An executor's heartbeat to the driver (``spark.executor.heartbeatInterval``)."""

NETWORK_TIMEOUT_SECONDS = 10
"""``spark.network.timeout``: the driver drops an executor without a heartbeat for this
long (and RPCs give up), instead of Spark's 120 s."""

WORKER_TIMEOUT_SECONDS = 10
"""``spark.worker.timeout``: the master drops a worker without a heartbeat for this long
(Spark's default 60 s); a worker beats every quarter of it."""

DAEMON_OPTIONS = (f"-Dspark.worker.timeout={WORKER_TIMEOUT_SECONDS}",)

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.python.task.killTimeout": "1s",
    "spark.executor.memory": "512m",
    "spark.network.timeout": f"{NETWORK_TIMEOUT_SECONDS}s",
    "spark.network.timeoutInterval": "1s",
    "spark.executor.heartbeatInterval": f"{HEARTBEAT_SECONDS}s",
    "spark.task.maxFailures": "8",
}
"""The driver's settings on top of the master, the addresses and the cores."""


@dataclass
class HostedStandaloneCluster(StandaloneCluster):
    """:class:`~tests.support.spark_standalone.StandaloneCluster` with the master on host 0
    of ``network`` and one worker on each other host but ``store_host`` (FoundationDB's)."""

    network: Cluster = field(kw_only=True)
    store_host: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.master_host = self.network.hosts[0].address
        self.daemon_options = DAEMON_OPTIONS

    def host(self, address: str) -> Host:
        """The host with ``address``."""
        return next(h for h in self.network.hosts if h.address == address)

    def worker_hosts(self) -> tuple[str, ...]:
        """Every host's address but the master's and the store's."""
        return tuple(h.address for h in self.network.hosts[1:] if h.index != self.store_host)

    def launch(self, host: str, argv: list[str]) -> list[str]:
        return self.host(host).exec_args(argv)

    def state(self) -> dict[str, Any]:
        with inside(self.host(self.master_host)):  # the master's page is on its host
            return super().state()

    def start_all(self) -> None:
        """Start the master and a worker on every other host; wait until all registered."""
        self.start(self.worker_hosts())

    def driver_conf(self) -> dict[str, str]:
        """The settings of a driver on the master's host using every worker's cores."""
        return {
            **SPARK_CONF,
            "spark.master": self.url,
            "spark.driver.host": self.master_host,
            "spark.driver.bindAddress": self.master_host,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.worker_hosts())),
            "spark.executorEnv.PYTHONPATH": python_path(),
            # Where the executors' workers load libfdb_c from (a FoundationDB folder).
            **{f"spark.executorEnv.{k}": v for k, v in os.environ.items() if k == HOME_VARIABLE},
        }


@dataclass
class Driver:
    """The driver process (:mod:`tests.support.hosts.spark_driver`) and its files."""

    process: Process
    result: Path

    def finished(self) -> bool:
        return self.process.popen.poll() is not None

    def summary(self) -> dict[str, Any]:
        """The run's summary the driver wrote; fails with its log if it wrote none."""
        code = self.process.popen.poll()
        assert code == 0, f"the driver exited with {code}:\n{self.process.tail(60)}"
        assert self.result.exists(), f"the driver wrote no summary:\n{self.process.tail(60)}"
        return dict(json.loads(self.result.read_text()))


def start_driver(
    spark: HostedStandaloneCluster,
    processor: ms.Processor,
    directory: Path,
    timeout: float,
    *,
    single_host: bool,
) -> Driver:
    """Start ``millstream.spark.run(processor, single_host=...)`` in a driver on the
    master's host."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = directory / "driver.json"
    result = directory / "summary.json"
    (directory / "processor.pickle").write_bytes(pickle.dumps(processor))
    spec.write_text(
        json.dumps(
            {
                "conf": spark.driver_conf(),
                "processor": str(directory / "processor.pickle"),
                "executors": len(spark.worker_hosts()),
                "timeout": timeout,
                "single_host": single_host,
                "result": str(result),
            }
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": python_path(),
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": spark.master_host,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    log = directory / "driver.log"
    argv = [sys.executable, "-m", "tests.support.hosts.spark_driver", str(spec)]
    with log.open("wb") as out:
        popen = subprocess.Popen(
            spark.host(spark.master_host).exec_args(argv),
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Driver(Process("driver", popen, log), result)
