"""Hosts with networks of their own: Linux network namespaces joined by a mesh of veth pairs.

Each host is a network namespace with one address in ``127.10.0.0/24`` (on its loopback
device, routed to every other host over a veth pair of its own). A per-pair mesh instead of
a bridge: this kernel has neither ``iptables`` nor ``nft`` (nor ``tc netem``), so the only
way to cut one pair of hosts and not the others is to take that pair's link down. Every cut
is expressed that way:

- :meth:`Cluster.isolate`: one host from all others (all its links down);
- :meth:`Cluster.partition`: two halves (every link across them down);
- :meth:`Cluster.cut`: one host from a subset only.

A link taken down drops packets without a reset: TCP connections across it stay open on
both sides (half-open) until a keepalive or deadline gives up on them, as on a real switch
failure. Delays and loss are not expressible (no netem). Nothing is created in the root
namespace: the namespaces and their veth pairs are removed by :meth:`Cluster.close`
(also at exit), and namespaces left by a test process that died are removed by the next.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

PREFIX = "mshost"
"""Namespaces this module creates are named ``PREFIX<pid>-<i>`` (the test process's pid)."""

SUBNET = "127.10.0"
"""Host ``i`` has address ``127.10.0.<i + 1>``: loopback range, never a real network."""


def require_root() -> None:
    """Skip the calling test unless it may create network namespaces (root, ``ip``)."""
    import pytest

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _batch(netns: str, commands: Iterable[str]) -> None:
    """Run ``ip`` commands inside ``netns`` in one process (``ip -batch``)."""
    text = "".join(f"{c}\n" for c in commands)
    done = subprocess.run(
        ["ip", "-n", netns, "-batch", "-"], input=text, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"ip -n {netns} -batch failed: {done.stderr.strip()}")


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(netns: str) -> None:
    """Kill what runs in ``netns`` (processes a test started there) and delete it."""
    for line in _ip("netns", "pids", netns, check=False).split():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(line), signal.SIGKILL)
    _ip("netns", "del", netns, check=False)


def remove_stale() -> list[str]:
    """Remove the namespaces of test processes that are gone; the names removed."""
    stale = []
    for name in _namespaces():
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(name)
            stale.append(name)
    return stale


@dataclass(frozen=True)
class Host:
    """One host: its index, network namespace and address."""

    index: int
    netns: str
    address: str

    def exec_args(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's network."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Cluster:
    """``size`` hosts, each linked to every other, all links up.

    Use as a context manager (or call :meth:`close`): the namespaces are removed on exit,
    at interpreter exit if the test never got there, and by the next test process if this
    one was killed.
    """

    size: int
    hosts: list[Host] = field(default_factory=list)
    _down: set[frozenset[int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not 2 <= self.size <= 250:
            raise ValueError(f"a cluster has 2 to 250 hosts, got {self.size}")
        remove_stale()
        tag = f"{PREFIX}{os.getpid()}"
        taken = {n for n in _namespaces() if n.startswith(tag + "-")}
        serial = next(i for i in itertools.count() if f"{tag}-{i}x0" not in taken)
        atexit.register(self.close)
        try:
            for i in range(self.size):
                host = Host(i, f"{tag}-{serial}x{i}", f"{SUBNET}.{i + 1}")
                _ip("netns", "add", host.netns)
                self.hosts.append(host)
                subprocess.run(
                    host.exec_args(["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"]),
                    check=True,
                )
                # 127.0.0.0/8 is all local by default: keep 127.0.0.1 and this host's own
                # address local, route the other hosts' addresses over the links.
                _batch(
                    host.netns,
                    [
                        "link set lo up",
                        "route del local 127.0.0.0/8 dev lo table local",
                        f"addr add {host.address}/32 dev lo",
                    ],
                )
            for a, b in itertools.combinations(self.hosts, 2):
                _batch(
                    a.netns, [f"link add v{b.index} type veth peer name v{a.index} netns {b.netns}"]
                )
            for a in self.hosts:
                commands = []
                for b in self.hosts:
                    if b is not a:
                        commands += [f"link set v{b.index} up", self._route(a.index, b.index)]
                _batch(a.netns, commands)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process inside the hosts and remove them (idempotent)."""
        hosts, self.hosts = self.hosts, []
        for host in hosts:
            _remove(host.netns)
        atexit.unregister(self.close)

    def _route(self, source: int, target: int) -> str:
        a, b = self.hosts[source], self.hosts[target]
        return f"route replace {b.address}/32 dev v{b.index} src {a.address}"

    # ---- cuts ------------------------------------------------------------------------

    def _set(self, pairs: Iterable[tuple[int, int]], state: str) -> None:
        by_host: dict[int, list[str]] = {}
        for a, b in pairs:
            if a == b:
                continue
            for x, y in ((a, b), (b, a)):
                commands = by_host.setdefault(x, [])
                commands.append(f"link set v{y} {state}")
                if state == "up":  # a link set down loses its routes: put them back
                    commands.append(self._route(x, y))
            if state == "down":
                self._down.add(frozenset((a, b)))
            else:
                self._down.discard(frozenset((a, b)))
        for index, commands in by_host.items():
            _batch(self.hosts[index].netns, commands)

    def cut(self, host: int, others: Iterable[int]) -> None:
        """Cut ``host`` from ``others`` only (their links down; the rest stay up)."""
        self._set(((host, o) for o in others), "down")

    def isolate(self, host: int) -> None:
        """Cut ``host`` from every other host (its link down)."""
        self.cut(host, range(self.size))

    def partition(self, side: Iterable[int]) -> None:
        """Cut the hosts in two: ``side`` and the rest."""
        one = set(side)
        self._set(((a, b) for a in one for b in range(self.size) if b not in one), "down")

    def heal(self) -> None:
        """Bring every link back up."""
        pairs = [tuple(sorted(p)) for p in self._down]
        self._set(((a, b) for a, b in pairs), "up")

    def cut_pairs(self) -> set[frozenset[int]]:
        """The pairs of hosts whose link is down, as the hosts' own links report it."""
        down = set()
        for host in self.hosts:
            for line in _ip("-n", host.netns, "-o", "link", "show").splitlines():
                name = line.split(":")[1].strip().split("@")[0]
                if name.startswith("v") and "state DOWN" in line:
                    down.add(frozenset((host.index, int(name[1:]))))
        return down

    def reaches(self, source: int, target: int, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from ``source`` to ``target``'s ``port`` is answered
        (accepted or refused) within ``timeout``."""
        host = self.hosts[target]
        code = (
            "import socket,sys\n"
            f"s=socket.socket(); s.settimeout({timeout})\n"
            f"try: s.connect(({host.address!r},{port}))\n"
            "except ConnectionRefusedError: sys.exit(0)\n"
            "except OSError: sys.exit(1)\n"
        )
        done = subprocess.run(self.hosts[source].exec_args(["python3", "-c", code]), check=False)
        return done.returncode == 0


@contextlib.contextmanager
def cluster(size: int) -> Iterator[Cluster]:
    """A :class:`Cluster` for the duration of a ``with`` block."""
    with Cluster(size) as c:
        yield c
