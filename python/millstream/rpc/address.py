"""Where a mapper's GetRows server listens and the address it publishes for reducers.

Reducers dial the address a mapper *advertises* in discovery, so it must be one they can
reach: loopback when every worker runs on this machine (the local runner), the executor's
own address on a cluster. The server *binds* the advertised address only, so a wrong
advertised address fails loudly instead of working by accident, unless the user binds
every interface (``Tuning.bind_host="0.0.0.0"``).

Whoever reaches a mapper's port can send it GetRows requests, so every runner serves
plaintext GetRows on loopback only: :func:`check_exposure` is the one rule they all apply
(mutual TLS, or the user's explicit ``Tuning.plaintext_get_rows``, for any other address).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol

from millstream.exceptions import ConfigurationError

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


class AddressSettings(Protocol):
    """The settings read here (a :class:`~millstream.Tuning` has them): plain values, so
    that GetRows knows nothing of the configuration above it."""

    @property
    def advertise_host(self) -> str | None:
        """The host reducers dial, if not the runner's."""
        ...

    @property
    def bind_host(self) -> str | None:
        """The host the server listens on, if not the advertised one."""
        ...

    @property
    def plaintext_get_rows(self) -> bool:
        """Plaintext accepted on any address (a trusted network)."""
        ...


def mapper_address(tuning: AddressSettings, host: str = LOOPBACK) -> MapperAddress:
    """The mapper's addresses: ``tuning``'s overrides, else ``host`` for both.

    Args:
        tuning: ``advertise_host`` and ``bind_host`` override the defaults when set.
        host: This machine's address as the runner knows it: loopback for the local
            runner, the executor's address on Spark.
    """
    advertise = tuning.advertise_host or host
    return MapperAddress(bind=tuning.bind_host or advertise, advertise=advertise)


def check_exposure(bind: str | None, *, tls: bool, tuning: AddressSettings, where: str) -> None:
    """Refuse plaintext GetRows on an address other hosts may reach.

    A GetRows request makes a mapper drop rows from its window (it produces them again:
    nothing is lost, but work is), so a mapper that listens beyond loopback needs mutual
    TLS, or the user's word that the network is trusted (``Tuning.plaintext_get_rows``).
    Every runner applies this rule: the local runner before it starts the workers, Spark's
    on the driver, and every mapper before it listens.

    Args:
        bind: The host the GetRows server listens on; None: each executor's own address
            on a cluster, not known yet (never loopback there).
        tls: Mutual TLS is configured for GetRows.
        tuning: ``plaintext_get_rows`` accepts plaintext anywhere.
        where: Who would listen, for the message (e.g. ``"mapper 0"``).

    Raises:
        ConfigurationError: Plaintext on a non-loopback address, not accepted.
    """
    if tls or tuning.plaintext_get_rows or (bind is not None and is_loopback(bind)):
        return
    address = "each executor's own address" if bind is None else repr(bind)
    raise ConfigurationError(
        f"{where} would serve GetRows in plaintext on {address}, which other hosts may "
        "reach: anyone who reaches the port could send a forged request (the mapper would "
        "drop rows and have to produce them again). Configure mutual TLS "
        "(Tuning.tls_ca_file, tls_cert_file and tls_key_file, or the environment's "
        "MILLSTREAM_TLS_CA_FILE, _CERT_FILE and _KEY_FILE, through spark.executorEnv.* on "
        "Spark; see the README, 'Securing GetRows'), or accept "
        "plaintext on a trusted network with Tuning(plaintext_get_rows=True)."
    )


__all__ = [
    "LOOPBACK",
    "AddressSettings",
    "MapperAddress",
    "check_exposure",
    "host_port",
    "is_loopback",
    "mapper_address",
]
