"""Nothing hangs on a connection a cut left half-open: a reducer's channel to a mapper
gives the connection up while the cut lasts (keepalive), and connects again once it heals.

Without keepalive, a connection whose packets a switch drops stays "ready" for as long as
TCP retransmits (about 15 minutes): every call on it waits out its deadline, and after the
heal the calls wait for TCP's next retransmission (measured: 25 s after a 30 s cut).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from millstream.rpc.client import KEEPALIVE_SECONDS, KEEPALIVE_TIMEOUT_SECONDS

from tests.support.hosts.cluster import Cluster

pytestmark = pytest.mark.usefixtures("root")

PROBE = str(Path(__file__).resolve().parents[1] / "support" / "hosts" / "probe.py")


def _ask(process: subprocess.Popen[str], command: str) -> str:
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def test_a_half_open_connection_is_given_up_during_a_cut_and_remade_after() -> None:
    bound = KEEPALIVE_SECONDS + KEEPALIVE_TIMEOUT_SECONDS
    with Cluster(2) as cluster:
        mapper, reducer = cluster.hosts
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        server = subprocess.Popen(
            mapper.exec_args([sys.executable, PROBE, "serve", mapper.address]), **pipes
        )
        watcher = None
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            watcher = subprocess.Popen(
                reducer.exec_args([sys.executable, PROBE, "watch", f"{mapper.address}:{port}"]),
                **pipes,
            )
            assert watcher.stdout is not None
            assert watcher.stdout.readline().strip() == "connected"
            # Idle (a Hold call under way) through several pings: the mapper accepts them.
            time.sleep(6 * KEEPALIVE_SECONDS)
            assert set(_ask(watcher, "states").split()) <= {"READY", "-"}
            cluster.cut(reducer.index, [mapper.index])  # the switch drops, no reset
            time.sleep(2 * bound)
            during = _ask(watcher, "states").split()
            assert set(during) - {"READY", "-"}, during  # the channel left READY
            cluster.heal()
            answers = []
            for _ in range(40):
                answers.append(_ask(watcher, "call"))
                if answers[-1] == "ok":
                    break
                time.sleep(0.5)
            assert answers[-1] == "ok", answers
        finally:
            for process in (watcher, server):
                if process is not None:
                    process.kill()
                    process.communicate()  # reaps it and closes its pipes
