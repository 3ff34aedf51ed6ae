"""Where a mapper's GetRows server listens and the address it publishes for reducers.

Reducers dial the address a mapper *advertises* in discovery, so it must be one they can
reach: loopback when every worker runs on this machine (the local runner), the executor's
own address on a cluster. The server *binds* the advertised address only, so a wrong
advertised address fails loudly instead of working by accident, unless the user binds
every interface (``Tuning.bind_host="0.0.0.0"``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from millstream.tuning import Tuning

LOOPBACK = "127.0.0.1"
"""The address workers that all run on this machine advertise and bind."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC expects it (IPv6 addresses in brackets)."""
    host = host.strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


@dataclass(frozen=True)
class MapperAddress:
    """The address a mapper's server binds and the one it advertises.

    Attributes:
        bind: Host the GetRows server listens on (``0.0.0.0`` or ``::`` for all).
        advertise: Host reducers dial, published in discovery.
    """

    bind: str
    advertise: str

    def endpoint(self, port: int) -> str:
        """The ``host:port`` reducers dial."""
        return host_port(self.advertise, port)


def mapper_address(tuning: Tuning, host: str = LOOPBACK) -> MapperAddress:
    """The mapper's addresses: ``tuning``'s overrides, else ``host`` for both.

    Args:
        tuning: ``advertise_host`` and ``bind_host`` override the defaults when set.
        host: This machine's address as the runner knows it: loopback for the local
            runner, the executor's address on Spark.
    """
    advertise = tuning.advertise_host or host
    return MapperAddress(bind=tuning.bind_host or advertise, advertise=advertise)


__all__ = ["LOOPBACK", "MapperAddress", "host_port", "is_loopback", "mapper_address"]
