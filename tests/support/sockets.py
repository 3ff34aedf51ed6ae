"""Which local addresses listen on a port, read from the kernel's socket tables."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_hosts(port: int, pid: int | None = None) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from ``/proc/net/tcp*``);
    with ``pid``, only the sockets of that process (another process may listen on the
    same port number at another address).

    IPv4-mapped IPv6 addresses (gRPC listens on IPv6 sockets) are given as IPv4.
    """
    owned = None if pid is None else _socket_inodes(pid)
    hosts: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            if owned is not None and line.split()[9] not in owned:
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                hosts.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                host = socket.inet_ntop(socket.AF_INET6, words)
                hosts.add(host.removeprefix("::ffff:") if "." in host else host)
    return hosts
