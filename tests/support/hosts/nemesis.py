"""A nemesis: while a job runs on hosts of their own, cut them apart at seeded random moments.

Cuts (each held for a while, then healed):

- ``isolate``: one host from all others (a worker's link down, its processes alive);
- ``halves``: the hosts in two halves, each with mappers and reducers;
- ``mapper_from_reducers``: one mapper's host from every reducer host only;
- ``pause``: one worker process stopped (SIGSTOP), then continued;
- ``kill``: one worker process killed (SIGKILL); the runner restarts it.

- ``worker_from_store``: one worker host from the store's host, when the store has a host
  of its own (FoundationDB; SQLite is a file every host shares).

Not planned here: a worker cut from the Spark driver. The local runner's workers talk to it
over pipes, not the network; that cut runs on a Spark standalone cluster across hosts
(:mod:`tests.support.hosts.spark_cut`, ``tests/hosts/test_spark_cut.py``, and the soak's
``--jobs spark``), too heavy to carry in every seed here within CI's time.

A cut *lands* when it is in place (links down as the hosts' own devices report it, the
process stopped as ``/proc`` reports it, the process gone) while the job still runs;
:meth:`Nemesis.check` fails on a planned cut that did not.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from millstream.runner.local import LocalRunner

from tests.support.hosts.cluster import Cluster
from tests.support.hosts.hosted import Layout

CUTS = ("isolate", "halves", "mapper_from_reducers", "pause", "kill")
"""Every cut the nemesis plans on any store."""

STORE_CUT = "worker_from_store"
"""One worker host cut from the store's host: planned when the store has a host of its own
(FoundationDB), ``Nemesis.store_host``."""


@dataclass
class Cut:
    """One planned cut: when (seconds after the previous heal), what, on whom, how long."""

    kind: str
    delay: float
    hold: float
    target: int
    """A host (network cuts) or a worker's position in the runner's sorted worker list."""
    side: tuple[int, ...] = ()
    """The half with ``target`` (``halves``)."""
    landed: bool = False
    what: str = ""
    """What was cut, for the report."""

    def __str__(self) -> str:
        mark = "landed" if self.landed else "DID NOT LAND"
        return f"{self.kind}({self.what or self.target}) {self.hold:.1f}s {mark}"


def plan(
    seed: int,
    layout: Layout,
    kinds: tuple[str, ...] = CUTS,
    holds: tuple[float, float] = (1.0, 6.0),
) -> list[Cut]:
    """Every cut of ``kinds`` once, in a seeded order, at seeded moments, on seeded targets,
    each held for a seeded time within ``holds`` seconds."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    cuts = []
    for kind in order:
        if kind == STORE_CUT:
            target = rng.choice(layout.mapper_hosts() + layout.reducer_hosts())
        elif kind == "mapper_from_reducers":
            target = rng.choice(layout.mapper_hosts())
        elif kind in ("pause", "kill"):
            target = rng.randrange(1 << 16)  # a worker: taken modulo the live ones
        else:
            target = rng.randrange(layout.size)
        side: tuple[int, ...] = ()
        if kind == "halves":  # each half with a mapper host and a reducer host at least
            side = (rng.choice(layout.mapper_hosts()), rng.choice(layout.reducer_hosts()))
        cuts.append(Cut(kind, rng.uniform(0.3, 1.5), rng.uniform(*holds), target, side))
    return cuts


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@dataclass
class Nemesis:
    """Applies ``cuts`` to ``cluster`` and the workers of ``runners`` (the stages of a
    pipeline, or one processor's runner) on a thread of its own.

    Use as a context manager around the run; ``healed_at`` is the monotonic time of the
    final heal (None until then).
    """

    cluster: Cluster
    runners: list[LocalRunner]
    layout: Layout
    cuts: list[Cut]
    store_host: int | None = None
    healed_at: float | None = None
    _drained: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> Nemesis:
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._drained.set()
        if self._thread is not None:
            self._thread.join()

    def done(self) -> bool:
        """Whether every cut was applied and healed."""
        return self.healed_at is not None

    def _run(self) -> None:
        try:
            for cut in self.cuts:
                if self._drained.wait(cut.delay):
                    return
                self._apply(cut)
        except BaseException as exc:  # reported by check()
            self._error = exc
        finally:
            self.cluster.heal()
            self.healed_at = time.monotonic()

    def _apply(self, cut: Cut) -> None:
        c, layout = self.cluster, self.layout
        if cut.kind in ("pause", "kill"):
            workers = sorted(
                ((i, wid) for i, r in enumerate(self.runners) for wid in r.pids() if wid[2] == 0),
                key=str,
            )
            stage, wid = workers[cut.target % len(workers)]
            pid = self.runners[stage].pids().get(wid)
            cut.what = f"{wid[0]} {wid[1]}" + (
                f" of stage {stage}" if len(self.runners) > 1 else ""
            )
            if pid is None or _state(pid) in (None, "Z"):
                return  # between a death and its restart: not landed
            if cut.kind == "kill":
                os.kill(pid, signal.SIGKILL)
                cut.landed = self._wait_for(lambda: _state(pid) in (None, "Z"))
                return
            os.kill(pid, signal.SIGSTOP)
            try:
                landed = self._wait_for(lambda: _state(pid) == "T")
                self._drained.wait(cut.hold)
                cut.landed = landed and not self._drained.is_set()
            finally:
                os.kill(pid, signal.SIGCONT)
            return
        if cut.kind == "isolate":
            cut.what = f"host {cut.target}"
            c.isolate(cut.target)
            expected = {frozenset((cut.target, h)) for h in range(c.size) if h != cut.target}
        elif cut.kind == "halves":
            side = set(cut.side)
            cut.what = f"hosts {sorted(side)} | the rest"
            c.partition(side)
            expected = {frozenset((a, b)) for a in side for b in range(c.size) if b not in side}
        elif cut.kind == STORE_CUT:
            assert self.store_host is not None, "a store cut needs the store on a host"
            cut.what = f"host {cut.target} from the store's host {self.store_host}"
            c.cut(cut.target, [self.store_host])
            expected = {frozenset((cut.target, self.store_host))}
        else:
            cut.what = f"mapper host {cut.target} from reducer hosts {layout.reducer_hosts()}"
            c.cut(cut.target, layout.reducer_hosts())
            expected = {frozenset((cut.target, r)) for r in layout.reducer_hosts()}
        try:
            in_place = c.cut_pairs() == expected
            self._drained.wait(cut.hold)
            cut.landed = in_place and not self._drained.is_set()
        finally:
            c.heal()

    @staticmethod
    def _wait_for(condition: Callable[[], bool]) -> bool:
        """Whether ``condition()`` holds within two seconds (a signal's effect on a
        process is not synchronous)."""
        for _ in range(100):
            if condition():
                return True
            time.sleep(0.02)
        return False

    def drained(self) -> None:
        """Tell the nemesis the run drained (cuts still planned will not land)."""
        self._drained.set()

    def check(self) -> None:
        """Fail if the nemesis failed or a planned cut did not land."""
        if self._error is not None:
            raise AssertionError(f"the nemesis failed: {self._error!r}") from self._error
        missed = [str(c) for c in self.cuts if not c.landed]
        if missed:
            raise AssertionError(f"planned cuts did not land: {missed}; all: {self.report()}")

    def report(self) -> str:
        """The cuts, in order, with what they hit and whether they landed."""
        return "; ".join(str(c) for c in self.cuts)
