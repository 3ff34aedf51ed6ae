"""The hosts fixture: namespaces that reach each other, cuts that land, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support.hosts.cluster import PREFIX, Cluster, remove_stale

pytestmark = pytest.mark.usefixtures("root")


def _ours() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    return {n for n in names if n.startswith(f"{PREFIX}{os.getpid()}-")}


def _reaches_soon(c: Cluster, source: int, target: int, port: int, seconds: float = 10) -> bool:
    """Whether ``source`` reaches ``target`` within ``seconds`` (a loaded machine may take
    a moment to bring a new or healed link up and resolve its neighbour)."""
    deadline = time.monotonic() + seconds
    while not c.reaches(source, target, port):
        if time.monotonic() > deadline:
            return False
    return True


def test_hosts_reach_each_other_and_cuts_cut_only_what_they_name() -> None:
    with Cluster(4) as c:
        port = 9  # nobody listens: a reachable host refuses at once
        assert all(_reaches_soon(c, a, b, port) for a in range(4) for b in range(4) if a != b)
        c.isolate(0)
        assert c.cut_pairs() == {frozenset((0, b)) for b in (1, 2, 3)}
        assert not c.reaches(0, 1, port)
        assert not c.reaches(3, 0, port)
        assert _reaches_soon(c, 1, 2, port)
        assert _reaches_soon(c, 3, 2, port)
        c.heal()
        assert c.cut_pairs() == set()
        c.partition([0, 1])
        assert not c.reaches(0, 2, port)
        assert not c.reaches(3, 1, port)
        assert _reaches_soon(c, 0, 1, port)
        assert _reaches_soon(c, 2, 3, port)
        c.heal()
        c.cut(0, [2, 3])  # from a subset only
        assert not c.reaches(0, 2, port)
        assert not c.reaches(0, 3, port)
        assert _reaches_soon(c, 0, 1, port)
        assert _reaches_soon(c, 1, 2, port)
        c.heal()
        assert all(_reaches_soon(c, 0, b, port) for b in (1, 2, 3))


def test_processes_run_in_their_host_and_nothing_is_left_behind() -> None:
    with Cluster(2) as c:
        names = _ours()
        assert names == set(c.namespaces())
        assert len(names) == 3  # two hosts and their wire
        child = subprocess.Popen(c.hosts[1].exec_args(["sleep", "60"]))
        try:
            inside = subprocess.run(
                c.hosts[1].exec_args(["ip", "-o", "addr", "show", "dev", "lo"]),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert c.hosts[1].address in inside
            assert c.hosts[0].address not in inside
        finally:
            c.close()  # kills what runs inside
        assert child.wait(timeout=10) != 0
    assert _ours() == set()


def test_namespaces_of_a_dead_test_process_are_removed() -> None:
    probe = subprocess.Popen(["true"])
    probe.wait()
    name = f"{PREFIX}{probe.pid}-0x0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in remove_stale()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
