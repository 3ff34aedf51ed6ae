"""Mutual TLS on the GetRows channel: who may ask a mapper for rows, and whom a reducer
trusts to answer.

A GetRows request carries a reducer's committed index, and whoever can send one can make a
mapper drop rows from its window (the mapper's store check keeps them from being lost, but
not from being produced again). On a cluster, the channel is therefore mutually
authenticated: every mapper serves with a certificate signed by the processor's CA and
requires one from its caller; every reducer presents one and checks the mapper's.

Three files configure it, all or none: the CA certificate, this worker's certificate and
its private key (PEM), from :class:`~millstream.Tuning` (``tls_ca_file``, ``tls_cert_file``,
``tls_key_file``) or else the environment (``MILLSTREAM_TLS_CA_FILE``,
``MILLSTREAM_TLS_CERT_FILE``, ``MILLSTREAM_TLS_KEY_FILE``), which is how Spark executors get
them (``spark.executorEnv.*``). ``tls_server_name`` (``MILLSTREAM_TLS_SERVER_NAME``) is the
name reducers expect in mappers' certificates when the certificates name a service rather
than each host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from millstream.exceptions import ConfigurationError

if TYPE_CHECKING:
    import grpc

ENV = {
    "tls_ca_file": "MILLSTREAM_TLS_CA_FILE",
    "tls_cert_file": "MILLSTREAM_TLS_CERT_FILE",
    "tls_key_file": "MILLSTREAM_TLS_KEY_FILE",
    "tls_server_name": "MILLSTREAM_TLS_SERVER_NAME",
}
"""The environment variable read for each knob the settings leave unset."""


class TlsSettings(Protocol):
    """The settings read here (a :class:`~millstream.Tuning` has them): plain values, so
    that GetRows knows nothing of the configuration above it."""

    @property
    def tls_ca_file(self) -> str | None:
        """The CA certificate(s), PEM."""
        ...

    @property
    def tls_cert_file(self) -> str | None:
        """This worker's certificate chain, PEM."""
        ...

    @property
    def tls_key_file(self) -> str | None:
        """This worker's private key, PEM."""
        ...

    @property
    def tls_server_name(self) -> str | None:
        """The name reducers check in mappers' certificates."""
        ...


@dataclass(frozen=True)
class TlsFiles:
    """The PEM contents of the three files, read once.

    Attributes:
        ca: The CA certificate(s) that sign every worker's certificate.
        cert: This worker's certificate chain.
        key: This worker's private key.
        server_name: The name reducers check in mappers' certificates; None: the host
            of the address the mapper advertises.
    """

    ca: bytes
    cert: bytes
    key: bytes
    server_name: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        """A mapper's: its certificate, and callers must present one the CA signed."""
        import grpc  # here, not at the top: a runner reads the files without loading gRPC

        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A reducer's: trusts mappers the CA signed, presents its own certificate."""
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def _setting(tuning: TlsSettings, name: str) -> str | None:
    value: str | None = getattr(tuning, name)
    if value is None:
        value = os.environ.get(ENV[name]) or None
    return value


def tls_files(tuning: TlsSettings) -> TlsFiles | None:
    """The GetRows channel's TLS files from ``tuning`` or the environment; None: plaintext.

    Raises:
        ConfigurationError: Some of the three files are configured and others not, or one
            cannot be read (each named, with where it was configured).
    """
    paths = {
        name: _setting(tuning, name) for name in ("tls_ca_file", "tls_cert_file", "tls_key_file")
    }
    given = [name for name, path in paths.items() if path]
    if not given:
        return None
    missing = [name for name, path in paths.items() if not path]
    if missing:
        raise ConfigurationError(
            "mutual TLS on GetRows needs three files, but "
            + ", ".join(f"{name} (or {ENV[name]})" for name in missing)
            + f" {'is' if len(missing) == 1 else 'are'} not set while "
            + ", ".join(given)
            + " "
            + ("is" if len(given) == 1 else "are")
            + ". Set all three (the CA certificate, this worker's certificate and its key), "
            "or none for plaintext"
        )
    contents = {}
    for name, path in paths.items():
        assert path is not None
        try:
            contents[name] = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read {name} {path!r} for mutual TLS on GetRows: {exc.strerror or exc}. "
                "Every executor needs the files at that path (ship them with spark-submit "
                "--files, or put them on every host)"
            ) from exc
        if b"-----BEGIN" not in contents[name]:
            raise ConfigurationError(
                f"{name} {path!r} is not a PEM file (no '-----BEGIN' line); give the CA "
                "certificate, this worker's certificate and its private key in PEM"
            )
    return TlsFiles(
        contents["tls_ca_file"],
        contents["tls_cert_file"],
        contents["tls_key_file"],
        _setting(tuning, "tls_server_name"),
    )
