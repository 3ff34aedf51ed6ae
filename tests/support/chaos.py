"""kill -9 at random: a thread that kills the processes a local runner started."""

from __future__ import annotations

import os
import random
import signal
import threading
from pathlib import Path
from types import TracebackType

import millstream as ms
from millstream.ledger import RunSummary
from millstream.runner.forkserver import fork_server_pid
from millstream.runner.local import LocalRunner


def started_by(runner: LocalRunner) -> dict[str, int]:
    """Every live process the runner started: its workers and its fork server."""
    pids = {
        f"{role}-{index}-{instance}": pid for (role, index, instance), pid in runner.pids().items()
    }
    server = fork_server_pid()
    if server is not None and running(server):
        pids["fork-server"] = server
    return pids


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed fork server stays one until the runner reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class RandomKiller:
    """While entered, kill a random process of ``runner`` every 0.05-0.5 s (seeded), at most
    ``max_kills`` times: a worker, or one time in five the fork server (which kills every
    worker with it). ``kills`` names the victims."""

    def __init__(self, runner: LocalRunner, seed: int, max_kills: int = 25) -> None:
        self.runner = runner
        self.rng = random.Random(seed)
        self.max_kills = max_kills
        self.kills: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._kill, daemon=True)

    def _kill(self) -> None:
        while not self._done.is_set() and len(self.kills) < self.max_kills:
            self._done.wait(self.rng.uniform(0.05, 0.5))
            pids = started_by(self.runner)
            workers = sorted(who for who in pids if who != "fork-server")
            if not workers:
                continue
            who = "fork-server" if "fork-server" in pids and self.rng.random() < 0.2 else None
            who = who or self.rng.choice(workers)
            if not running(pids[who]):
                continue  # exited (a zombie not reaped yet): killing it changes nothing
            try:
                os.kill(pids[who], signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append(who)

    def __enter__(self) -> RandomKiller:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()


def run_killed(
    processor: ms.Processor, seed: int, *, timeout: float = 300, max_kills: int = 25
) -> tuple[RunSummary, list[str]]:
    """Run ``processor`` on a local runner until it drains, under a :class:`RandomKiller` of
    ``seed``: the run's summary and the victims. Fails when the killer found no live
    process to kill (the run proved nothing about kill -9)."""
    runner = LocalRunner(processor)
    runner.start()
    with RandomKiller(runner, seed, max_kills) as killer:
        summary = runner.wait(timeout=timeout)
    assert killer.kills, "the killer never found a live process"
    return summary, killer.kills
