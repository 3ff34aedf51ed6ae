"""Where a local worker runs: a network namespace of its own, with the address it advertises.

The local runner starts every worker on this machine's loopback. A test of partitions needs
workers on hosts with networks of their own (Linux network namespaces, each with an address
the others reach), so that a cut leaves the processes alive: :class:`WorkerHost` names one
such host, and the runner's forked worker enters it before it opens any socket.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from millstream.exceptions import ConfigurationError

NETNS_DIR = "/var/run/netns"
"""Where ``ip netns add`` pins named network namespaces."""

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class WorkerHost:
    """A host a local worker runs on.

    Attributes:
        address: The address the worker's GetRows server binds and discovery publishes
            (the host's own, reachable from the other hosts).
        netns: The named network namespace (``ip netns add NAME``) the worker enters;
            None: this machine's own network.
    """

    address: str
    netns: str | None = None

    def enter(self) -> None:
        """Move this process into :attr:`netns` (call it before any thread or socket).

        Raises:
            ConfigurationError: The namespace does not exist or cannot be entered.
        """
        if self.netns is None:
            return
        path = os.path.join(NETNS_DIR, self.netns)
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open network namespace {self.netns!r} ({exc}): create it with "
                f"`ip netns add {self.netns}` before the run"
            ) from None
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise ConfigurationError(
                    f"cannot enter network namespace {self.netns!r}: {os.strerror(err)} "
                    "(entering one needs CAP_SYS_ADMIN: run as root)"
                )
        finally:
            os.close(fd)


__all__ = ["NETNS_DIR", "WorkerHost"]
