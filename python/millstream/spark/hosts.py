"""Where the executors are: the address each mapper advertises, and what a cluster refuses.

On a local master every worker runs on this machine, so mappers advertise loopback. On a
cluster each mapper advertises the address its executor is bound to, found in the
executor's Python worker: ``SPARK_LOCAL_IP`` (Spark's own setting for the address an
executor binds), else ``SPARK_EXECUTOR_POD_IP`` (Kubernetes), else the address of the
interface that routes to the driver. ``Tuning.advertise_host`` overrides all three.

Two setups work on one machine and silently break on several, so :func:`check_deployment`
refuses them on a non-local master unless the user states that every executor runs on
this host (``single_host=True``): the embedded SQLite store (each host would open its own
file) and a loopback advertised address (a reducer would dial its own host). A standalone
master on a loopback address (``spark://127.0.0.1:7077``) needs no such statement for the
addresses: only this machine's workers can register with it, so loopback reaches every
executor. It still needs one for SQLite, the store a deployment keeps as it grows.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millstream.exceptions import ConfigurationError
from millstream.rpc.address import LOOPBACK, check_exposure, is_loopback, mapper_address
from millstream.rpc.tls import ENV as TLS_ENV
from millstream.state import parse_store_url

if TYPE_CHECKING:
    from millstream.processor import Processor

_LOCAL_MASTER = re.compile(r"^local(?:\[[^\]]*\]|-cluster\[[^\]]*\])?$")

HOST_VARIABLES = ("SPARK_LOCAL_IP", "SPARK_EXECUTOR_POD_IP")
"""Environment variables naming the executor's address, in the order they are tried."""


def is_local_master(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine (``local[...]``,
    ``local-cluster[...]``)."""
    return bool(_LOCAL_MASTER.match(master.strip()))


def master_on_loopback(master: str) -> bool:
    """Whether ``master`` is a standalone master on loopback addresses only
    (``spark://127.0.0.1:7077``): only this machine's workers can register with it."""
    found = re.match(r"^spark://(.+)$", master.strip())
    if not found:
        return False
    hosts = [entry.rpartition(":")[0] or entry for entry in found.group(1).split(",")]
    return all(is_loopback(host) for host in hosts)


def route_address(host: str, port: int) -> str | None:
    """The local address of the interface that routes to ``host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, target in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(target)
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return None


def executor_host(
    driver_host: str | None, driver_port: int, environ: Mapping[str, str] = os.environ
) -> tuple[str, str]:
    """This executor's address and where it came from.

    Args:
        driver_host: ``spark.driver.host``; the route to it names the interface.
        driver_port: ``spark.driver.port``.
        environ: The executor's environment.

    Returns:
        ``(address, source)``, e.g. ``("10.0.0.7", "SPARK_LOCAL_IP")``.
    """
    for name in HOST_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value, name
    if driver_host:
        routed = route_address(driver_host, driver_port or 7077)
        if routed:
            return routed, f"the interface that routes to the driver at {driver_host}"
    return LOOPBACK, "no SPARK_LOCAL_IP and no route to the driver"


@dataclass(frozen=True)
class Deployment:
    """What the driver knows about where the workers run, shipped to every task.

    Attributes:
        master: ``spark.master``.
        single_host: The user stated that every executor runs on this machine.
        driver_host: ``spark.driver.host``.
        driver_port: ``spark.driver.port``.
        executor_tls: The executors get the GetRows TLS files through their environment
            (``spark.executorEnv.MILLSTREAM_TLS_CA_FILE`` is set).
    """

    master: str
    single_host: bool
    driver_host: str | None
    driver_port: int
    executor_tls: bool = False

    @property
    def on_one_host(self) -> bool:
        """Every executor runs on this machine: a local master, or stated by the user."""
        return self.single_host or is_local_master(self.master)

    @property
    def executors_here(self) -> bool:
        """Every executor runs on this machine, so loopback addresses reach them all:
        :attr:`on_one_host`, or a standalone master on a loopback address."""
        return self.on_one_host or master_on_loopback(self.master)

    def worker_host(self, processor: Processor, environ: Mapping[str, str] = os.environ) -> str:
        """The address a worker in this executor advertises and binds, checked.

        Raises:
            ConfigurationError: A loopback address on a cluster not stated single-host.
        """
        if is_local_master(self.master):
            return LOOPBACK
        if processor.tuning.advertise_host:
            return processor.tuning.advertise_host
        host, source = executor_host(self.driver_host, self.driver_port, environ)
        if is_loopback(host) and not self.executors_here:
            raise ConfigurationError(
                _loopback_refused(
                    host,
                    f"from {source}",
                    self.master,
                    "Set SPARK_LOCAL_IP on every Spark worker (spark-env.sh) to the host's "
                    "address the others reach, or Tuning(advertise_host=...)",
                )
            )
        return host


def _loopback_refused(host: str, source: str, master: str, fix: str) -> str:
    return (
        f"a mapper would advertise the loopback address {host} ({source}) on the non-local "
        f"master {master!r}: reducers on other hosts would dial themselves. {fix}; if every "
        "executor runs on this machine, pass single_host=True to millstream.spark.run."
    )


def deployment_of(sc: Any, single_host: bool) -> Deployment:
    """The :class:`Deployment` of a live ``SparkContext``."""
    conf = sc.getConf()
    master = str(sc.master)
    try:
        port = int(str(conf.get("spark.driver.port", "0")))
    except ValueError:
        port = 0
    return Deployment(
        master=master,
        single_host=single_host,
        driver_host=conf.get("spark.driver.host", None),
        driver_port=port,
        executor_tls=bool(conf.get(f"spark.executorEnv.{TLS_ENV['tls_ca_file']}", None)),
    )


def check_deployment(processor: Processor, deployment: Deployment) -> None:
    """Refuse, on the driver, what works on one machine but silently breaks on several.

    Raises:
        ConfigurationError: An SQLite store or a loopback ``Tuning.advertise_host`` on a
            non-local master that the user did not state single-host; plaintext GetRows
            beyond loopback without ``Tuning.plaintext_get_rows`` on any master
            (:func:`~millstream.rpc.address.check_exposure`).
    """
    master = deployment.master
    t = processor.tuning
    tls = bool(t.tls_ca_file or deployment.executor_tls)
    where = f"a mapper on the Spark master {master!r}"
    if is_local_master(master) or t.bind_host or t.advertise_host:
        tls = tls or (is_local_master(master) and bool(os.environ.get(TLS_ENV["tls_ca_file"])))
        check_exposure(mapper_address(t).bind, tls=tls, tuning=t, where=where)
    elif not deployment.single_host and not master_on_loopback(master):
        check_exposure(None, tls=tls, tuning=t, where=where)
    # Executors on this host that advertise their own addresses check them themselves.
    if deployment.on_one_host:
        return
    if parse_store_url(processor.store).scheme == "sqlite":
        raise ConfigurationError(
            f"the embedded SQLite store {processor.store!r} on the non-local master "
            f"{master!r}: every executor host would open its own file, and the workers "
            "would not see each other's state. Use a FoundationDB store (fdb://) that "
            "every executor reaches, or, if every executor runs on this machine, pass "
            "single_host=True to millstream.spark.run."
        )
    advertised = processor.tuning.advertise_host
    if advertised and is_loopback(advertised) and not deployment.executors_here:
        raise ConfigurationError(
            _loopback_refused(
                advertised,
                "Tuning.advertise_host",
                master,
                "Leave Tuning.advertise_host unset (each executor then advertises its own "
                "address) or set it to an address the other hosts reach",
            )
        )


__all__ = [
    "HOST_VARIABLES",
    "Deployment",
    "check_deployment",
    "deployment_of",
    "executor_host",
    "is_local_master",
    "master_on_loopback",
    "route_address",
]
