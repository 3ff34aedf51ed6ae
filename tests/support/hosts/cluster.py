"""Hosts with networks of their own: Linux network namespaces wired pairwise.

Each host is a network namespace with one address in ``127.10.0.0/24`` (on its loopback
device) and a link to every other host: a veth pair into a *wire* namespace of that pair of
hosts, where a bridge joins the two ends (the switch port of that pair). This kernel has
neither ``iptables`` nor ``nft`` (nor ``tc netem``), so a per-pair switch is the way to cut
one pair of hosts and not the others. Two kinds of cut:

- **link down** (:meth:`Cluster.isolate`): the host's own links go down, its processes
  live on; the host sees it (its routes go), the other hosts see nothing: packets to it
  are dropped without a reset.
- **switch drop** (:meth:`Cluster.partition` for two halves, :meth:`Cluster.cut` for one
  host from a subset): the wire's ports leave its bridge; both hosts keep their links up,
  and every packet between them is dropped silently.

Either way TCP connections across a cut stay open on both sides (half-open) until a
keepalive or a deadline gives up on them, as on a real network. Delays and loss are not
expressible (no netem). Nothing is created in the root namespace: the namespaces (and the
veth pairs in them) are removed by :meth:`Cluster.close`, at exit, and, for a test process
that died, by the next one (:func:`remove_stale`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fdb_cluster import FdbCluster, find_binaries, start_cluster

PREFIX = "mshost"
"""Namespaces this module creates are named ``PREFIX<pid>-<i>`` (the test process's pid)."""

SUBNET = "127.10.0"
"""Host ``i`` has address ``127.10.0.<i + 1>``: loopback range, never a real network."""


def require_root() -> None:
    """Skip the calling test unless it may create network namespaces (root, ``ip``)."""
    import pytest

    if os.geteuid() != 0 or shutil.which("ip") is None:
        reason = "network namespaces need root and iproute2's `ip`"
        if os.environ.get("MILLSTREAM_REQUIRE_HOSTS") == "1":  # CI: a skip would hide them
            pytest.fail(f"{reason}, and MILLSTREAM_REQUIRE_HOSTS=1 asks for the hosts tests")
        pytest.skip(reason)


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
    _wires: list[str] = field(default_factory=list)
    _dropped: set[frozenset[int]] = field(default_factory=set)
    """Pairs whose switch port drops everything."""
    _isolated: set[int] = field(default_factory=set)
    """Hosts whose links are down."""

    def __post_init__(self) -> None:
        if not 2 <= self.size <= 250:
            raise ValueError(f"a cluster has 2 to 250 hosts, got {self.size}")
        remove_stale()
        tag = f"{PREFIX}{os.getpid()}"
        taken = {n for n in _namespaces() if n.startswith(tag + "-")}
        serial = next(i for i in itertools.count() if f"{tag}-{i}x0" not in taken)
        self._tag = f"{tag}-{serial}"
        atexit.register(self.close)
        try:
            for i in range(self.size):
                host = Host(i, f"{self._tag}x{i}", f"{SUBNET}.{i + 1}")
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
                wire = self._wire(a.index, b.index)
                _ip("netns", "add", wire)
                self._wires.append(wire)
                _batch(a.netns, [f"link add v{b.index} type veth peer name pa netns {wire}"])
                _batch(b.netns, [f"link add v{a.index} type veth peer name pb netns {wire}"])
                _batch(
                    wire,
                    [
                        "link add name sw type bridge",
                        "link set sw up",
                        *(f"link set dev p{end} master sw" for end in "ab"),
                        *(f"link set dev p{end} up" for end in "ab"),
                    ],
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

    def namespaces(self) -> list[str]:
        """Every namespace of the cluster: the hosts' and the wires'."""
        return [h.netns for h in self.hosts] + self._wires

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process inside the hosts and remove them (idempotent)."""
        hosts, self.hosts = self.hosts, []
        wires, self._wires = self._wires, []
        for name in [h.netns for h in hosts] + wires:
            _remove(name)
        atexit.unregister(self.close)

    def _route(self, source: int, target: int) -> str:
        a, b = self.hosts[source], self.hosts[target]
        return f"route replace {b.address}/32 dev v{b.index} src {a.address}"

    def _wire(self, a: int, b: int) -> str:
        return f"{self._tag}w{min(a, b)}-{max(a, b)}"

    # ---- cuts ------------------------------------------------------------------------

    def _switch(self, pairs: Iterable[tuple[int, int]], drop: bool) -> None:
        for a, b in pairs:
            pair = frozenset((a, b))
            if a == b or (pair in self._dropped) == drop:
                continue
            how = "nomaster" if drop else "master sw"
            _batch(self._wire(a, b), [f"link set dev pa {how}", f"link set dev pb {how}"])
            (self._dropped.add if drop else self._dropped.discard)(pair)

    def cut(self, host: int, others: Iterable[int]) -> None:
        """Cut ``host`` from ``others`` only: the switch drops what they send each other."""
        self._switch(((host, o) for o in others), drop=True)

    def partition(self, side: Iterable[int]) -> None:
        """Cut the hosts in two, ``side`` and the rest: the switch drops what crosses."""
        one = set(side)
        self._switch(((a, b) for a in one for b in range(self.size) if b not in one), True)

    def isolate(self, host: int) -> None:
        """Cut ``host`` from every other host: its links go down (its processes live on)."""
        _batch(
            self.hosts[host].netns,
            [f"link set v{o} down" for o in range(self.size) if o != host],
        )
        self._isolated.add(host)

    def heal(self) -> None:
        """Bring every link back up and the switch back to forwarding."""
        for host in sorted(self._isolated):
            commands = []
            for o in range(self.size):
                if o != host:  # a link set down lost its routes: put them back
                    commands += [f"link set v{o} up", self._route(host, o)]
            _batch(self.hosts[host].netns, commands)
        self._isolated.clear()
        self._switch([tuple(sorted(p)) for p in self._dropped], drop=False)  # type: ignore[misc]

    def cut_pairs(self) -> set[frozenset[int]]:
        """The pairs of hosts cut apart, as the hosts' links and the wires' bridges report
        it."""
        down = set()
        for host in self.hosts:
            for line in _ip("-n", host.netns, "-o", "link", "show").splitlines():
                name = line.split(":")[1].strip().split("@")[0]
                if name.startswith("v") and "state DOWN" in line:
                    down.add(frozenset((host.index, int(name[1:]))))
        for a, b in itertools.combinations(range(self.size), 2):
            ports = _ip("-n", self._wire(a, b), "-o", "link", "show", "master", "sw")
            if ports.count("master sw") < 2:
                down.add(frozenset((a, b)))
        return down

    def reaches(self, source: int, target: int, port: int, timeout: float = 0.5) -> bool:
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
def inside(host: Host) -> Iterator[None]:
    """Run the calling thread inside ``host``'s network while the block lasts (sockets it
    opens, threads it starts, stay there); back to its own network after."""
    from millstream.runner.placement import WorkerHost

    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        WorkerHost(host.address, host.netns).enter()
        try:
            yield
        finally:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            if libc.setns(own, 0x40000000) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to this thread's network")
    finally:
        os.close(own)


def start_foundationdb(host: Host, directory: Path, port: int = 4500) -> FdbCluster:
    """A one-process FoundationDB cluster on ``host``, its files in ``directory``, from the
    binaries the tests find (``$MILLSTREAM_FDB_HOME``, ``../shared/fdb`` or the standard
    install paths: :func:`tests.support.fdb_cluster.find_binaries`). It runs inside the
    host: :meth:`FdbCluster.stop` or :meth:`Cluster.close` ends it.

    Raises:
        RuntimeError: No binaries were found (why), or the cluster did not start.
    """
    binaries, missing = find_binaries(Path(__file__).resolve().parents[3])
    if binaries is None:
        raise RuntimeError(missing)
    return start_cluster(
        binaries, host=(host.address, port), launch=host.exec_args, directory=directory
    )


@contextlib.contextmanager
def cluster(size: int) -> Iterator[Cluster]:
    """A :class:`Cluster` for the duration of a ``with`` block."""
    with Cluster(size) as c:
        yield c
