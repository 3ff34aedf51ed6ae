"""The runner's Prometheus endpoint: every worker's metrics and the runner's own, on one port.

Workers write their metrics into a ``prometheus_client`` multiprocess directory (see
:mod:`millstream.workers.prometheus`); this serves that directory and the runner's restart
counts over HTTP at ``/metrics``, on loopback unless the user names another address
(``metrics_host``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from millstream.exceptions import ConfigurationError
from millstream.rpc.address import LOOPBACK, host_port, is_loopback
from millstream.workers.prometheus import MULTIPROC_ENV


class _RunnerCollector:
    """The runner's own figures, read when scraped."""

    def __init__(self, restarts: Callable[[], Mapping[tuple[str, int], int]]) -> None:
        self._restarts = restarts

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "millstream_restarts",
            "Worker processes the runner restarted after they died.",
            labels=["role", "index", "partition"],
        )
        for (role, index), count in sorted(self._restarts().items()):
            family.add_metric([role, str(index), str(index)], count)
        yield family


class MetricsServer:
    """Serves ``/metrics`` for a local run until :meth:`close`.

    Args:
        port: TCP port; 0 picks a free one (see :attr:`port`).
        restarts: The runner's restarts per worker, ``{(role, index): count}``.
        directory: The multiprocess directory; a fresh temporary one by default (removed
            on close).
        host: Address to listen on: loopback by default (only this machine scrapes);
            ``"0.0.0.0"`` (or ``"::"``) for every interface, or one of this host's
            addresses.
    """

    def __init__(
        self,
        port: int,
        restarts: Callable[[], Mapping[tuple[str, int], int]],
        *,
        directory: str | None = None,
        host: str = LOOPBACK,
    ) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        self._owned = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="millstream-metrics-")
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        registry.register(_RunnerCollector(restarts))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            self._remove()
            raise ConfigurationError(
                f"cannot serve metrics on {host}:{port}: {exc}. Choose a free port "
                "(metrics_port=0 picks one) or stop what listens there"
            ) from exc
        self.port: int = self._server.server_port
        """The port actually listened on."""
        self.host = host
        """The address listened on."""

    @property
    def url(self) -> str:
        """Where this machine scrapes the endpoint."""
        every = self.host.strip("[]") in ("0.0.0.0", "::", "")
        host = "localhost" if every or is_loopback(self.host) else self.host
        return f"http://{host_port(host, self.port)}/metrics"

    @property
    def environ(self) -> dict[str, str]:
        """What a worker's environment needs to write its metrics here."""
        return {MULTIPROC_ENV: self.directory}

    def close(self) -> None:
        """Stop serving and free the port (and remove a temporary directory)."""
        self._server.shutdown()
        self._server.server_close()
        if isinstance(self._thread, threading.Thread):
            self._thread.join()
        self._remove()

    def _remove(self) -> None:
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)


__all__ = ["MetricsServer"]
