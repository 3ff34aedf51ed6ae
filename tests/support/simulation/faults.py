"""Faults the simulation injects, and how the workers' loops take them.

- :class:`FaultyStore`: a real store whose commits fail with a conflict, report an unknown
  result (``CommitUnknownResultError``, as FoundationDB does) after being applied, without
  being applied, or while still in flight (the commit lands later, after the worker has
  looked, if nothing it read changed meanwhile), take longer than the five-second limit,
  or whose every transaction fails (unavailable); latency runs other steps while a worker's
  transaction is being created or committed (:meth:`FaultPlan.stall`). :class:`CommitHook`
  aims latency at one commit.
- :class:`SimNetwork`, an in-process :class:`~millstream.rpc.client.RowsClient` that drops,
  duplicates, delays and reorders GetRows requests and responses, and can run other steps
  between a reducer's state read, the mappers' answers and the reducer's commit (so a
  response is stale by the time it is reduced).
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from millstream.exceptions import (
    CommittedIndexError,
    CommitUnknownResultError,
    InputError,
    RetryableStoreError,
    StaleMapperError,
    StoreConflictError,
    StoreUnavailableError,
)
from millstream.rpc.calls import GetRowsCall, GetRowsResult
from millstream.state import Store, pack
from millstream.state.retry import run_transaction
from millstream.testing import InProcessTransport, ManualClock
from millstream.workers import MapperWorker

if TYPE_CHECKING:
    from tests.support.simulation.simulation import Simulation
    from tests.support.simulation.steps import Action

CRASH_ERRORS = (InputError, ConnectionError)
"""Errors after which a worker process dies (its loop lets them out) and is restarted."""


STORE_ERRORS = (RetryableStoreError, StoreUnavailableError)
"""Errors a worker's loop notes and retries after a back-off (same instance)."""


# -- the store, with injected faults ---------------------------------------------------

COMMIT_FAULTS = (
    "conflict",
    "unknown",
    "unavailable",
    "too_old",
    "unknown_unapplied",
    "unknown_late",
)
"""``unknown``: applied, then reported unknown; ``unknown_unapplied``: reported unknown and
never applied; ``unknown_late``: reported unknown while still in flight, applied at the
next commit of any transaction (after the worker looked) unless what it read changed."""


class FaultPlan:
    """Faults the store injects.

    - ``armed``: commit faults, used by the next commits in order;
    - ``unavailable``: every transaction fails;
    - ``stalls``: latency. Each entry ``[n, fn]`` waits for ``n`` more store calls
      (transaction creations and commits, by any worker), then ``fn`` runs while the next
      one is pending: the steps in ``fn`` happen while that worker waits on the store.
    """

    def __init__(self, clock: ManualClock, note: Callable[[str], None]) -> None:
        self.clock = clock
        self.note = note
        self.armed: deque[str] = deque()
        self.unavailable = False
        self.injected: Counter[str] = Counter()
        self.stalls: deque[list[Any]] = deque()
        self._stalling = False
        self.in_flight: deque[Any] = deque()

    def next_commit_fault(self) -> str | None:
        if self.unavailable:
            return "unavailable"
        return self.armed.popleft() if self.armed else None

    def stall(self) -> None:
        """One store call is about to happen: run the latency armed for it, if any."""
        if not self.stalls or self._stalling:
            return
        entry = self.stalls[0]
        if entry[0] > 0:
            entry[0] -= 1
            return
        self.stalls.popleft()
        self.injected["stall"] += 1
        self.note("  store stalls")
        self._stalling = True
        try:
            entry[1]()
        finally:
            self._stalling = False

    # -- ambiguous commits that land late ----------------------------------------------

    def hold(self, inner: Any) -> None:
        """Keep ``inner``'s commit in flight: it lands at the next commit (:meth:`land`)."""
        inner._release(rollback=False)  # its writes and read set stay; the snapshot ends
        self.in_flight.append(inner)

    def land(self) -> None:
        """Commits in flight are applied now, each only if nothing it read has changed."""
        while self.in_flight:
            inner = self.in_flight.popleft()
            try:
                inner._raw_commit()  # conflict-checked against everything committed since
                self.injected["late_landed"] += 1
                self.note("  in-flight commit lands")
            except StoreConflictError:
                self.injected["late_aborted"] += 1
                self.note("  in-flight commit aborted (what it read changed)")


class FaultyTransaction:
    """A real transaction whose commit may fail, before or after being applied."""

    def __init__(self, inner: Any, plan: FaultPlan, fresh: Callable[[], Any]) -> None:
        self._inner = inner
        self._plan = plan
        self._fresh = fresh

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self) -> None:
        self._plan.stall()
        self._plan.land()
        fault = self._plan.next_commit_fault()
        if fault is not None:
            self._plan.injected[fault] += 1
            self._plan.note(f"  store fault: {fault}")
        if fault == "conflict":
            self._inner.reset()
            raise StoreConflictError("injected conflict (simulation)")
        if fault == "unavailable":
            self._inner.reset()
            raise StoreUnavailableError("injected: store unavailable (simulation)")
        if fault == "unknown_unapplied":
            self._inner.reset()
            raise CommitUnknownResultError("injected: commit not applied but reported unknown")
        if fault == "unknown_late":
            if self._inner._started is not None:
                self._inner._limits.check_age(self._plan.clock.now() - self._inner._started)
            inner, self._inner = self._inner, self._fresh()
            self._plan.hold(inner)
            raise CommitUnknownResultError("injected: commit in flight, reported unknown")
        if fault == "too_old":
            # The commit is slow: the transaction's age passes FoundationDB's five seconds.
            self._plan.clock.advance(6.0)
        self._inner.commit()
        if fault == "unknown":
            raise CommitUnknownResultError("injected: commit applied but reported unknown")


class FaultyStore:
    """A real store whose transactions go through :class:`FaultyTransaction`."""

    def __init__(self, inner: Store, plan: FaultPlan) -> None:
        self._inner = inner
        self._plan = plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    read = Store.read  # reads go through the faulty create_transaction below

    def create_transaction(self) -> Any:
        self._plan.stall()
        if self._plan.unavailable:
            self._plan.injected["unavailable"] += 1
            self._plan.note("  store fault: unavailable")
            raise StoreUnavailableError("injected: store unavailable (simulation)")
        inner = self._inner
        return FaultyTransaction(inner.create_transaction(), self._plan, inner.create_transaction)

    def transact(
        self, fn: Callable[[Any], Any], *, idempotent: bool = False, max_retries: int | None = 20
    ) -> Any:
        """:meth:`Store.transact`'s retry loop, without sleeping between retries."""
        return run_transaction(
            self.create_transaction,
            fn,
            idempotent=idempotent,
            max_retries=max_retries,
            sleep=lambda seconds: None,
        )


class CommitHook:
    """A store whose first commit of a transaction that read ``key`` runs ``fn`` first.

    Latency aimed at one commit: ``fn``'s steps happen after the worker read and wrote
    everything and before its commit reaches the store.
    """

    def __init__(self, inner: Any, key: tuple[Any, ...], fn: Callable[[], None]) -> None:
        self._inner = inner
        self.key = key
        self.raw_key = inner.prefix_bytes + pack(key)
        self.fn: Callable[[], None] | None = fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    read = Store.read

    def create_transaction(self) -> Any:
        return _HookedTransaction(self._inner.create_transaction(), self)


class _HookedTransaction:
    def __init__(self, inner: Any, hook: CommitHook) -> None:
        self._inner = inner
        self._hook = hook
        self._read_key = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        if key == self._hook.key:
            self._read_key = True
        return self._inner.get(key, *args, **kwargs)

    def _raw_get(self, key: bytes, snapshot: bool) -> Any:
        # A transaction that wraps this one (the reducer's ReplayingTransaction) reads here.
        if key == self._hook.raw_key:
            self._read_key = True
        return self._inner._raw_get(key, snapshot)

    def get_each(self, keys: Any, *args: Any, **kwargs: Any) -> Any:
        if self._hook.key in keys:
            self._read_key = True
        return self._inner.get_each(keys, *args, **kwargs)

    def _raw_get_many(self, keys: list[bytes], snapshot: bool) -> Any:
        if self._hook.raw_key in keys:
            self._read_key = True
        return self._inner._raw_get_many(keys, snapshot)

    def commit(self) -> None:
        fn = self._hook.fn
        if self._read_key and fn is not None:
            self._hook.fn = None
            fn()
        self._inner.commit()


# -- the network -----------------------------------------------------------------------

NET_FAULTS = ("ok", "drop_request", "drop_response", "duplicate", "delay_request")


class SimNetwork(InProcessTransport):
    """In-process GetRows with faults: routes a call by address to the instance bound there.

    Before a reducer iteration the simulation sets, for that one call, per-call faults and
    steps to run before the mappers answer and after (stale answers), and whether the calls
    are served in reverse order.
    """

    def __init__(self, sim: Simulation) -> None:
        super().__init__()
        self.sim = sim
        self.faults: Sequence[str] = ()
        self.before: Sequence[Action] = ()
        self.after: Sequence[Action] = ()
        self.reverse = False
        self.late: deque[GetRowsCall] = deque()
        self.unreachable: set[int] = set()

    def get_rows_many(self, calls: Sequence[GetRowsCall]) -> list[GetRowsResult | BaseException]:
        faults, before, after = self.faults, self.before, self.after
        self.faults, self.before, self.after = (), (), ()
        self.sim.run_nested(before)
        results: list[GetRowsResult | BaseException] = [TimeoutError("no answer") for _ in calls]
        order = list(range(len(calls)))
        if self.reverse:
            order.reverse()
        for i in order:
            call = calls[i]
            fault = faults[i] if i < len(faults) else "ok"
            if call.mapper_index in self.unreachable:
                results[i] = ConnectionError(f"mapper {call.mapper_index} unreachable (sim)")
                continue
            if fault == "drop_request":
                continue
            if fault == "delay_request":
                self.late.append(call)
                continue
            early = self.take_prefetched(call)
            if early is not None and fault != "drop_response":
                self.sim.note(f"  m{call.mapper_index}: the answer fetched during the commit")
                results[i] = early
                continue
            try:
                result = self.serve(call)
                if fault == "duplicate":
                    result = self.serve(call)
            except (ConnectionError, StaleMapperError, CommittedIndexError) as exc:
                self.sim.note(f"  m{call.mapper_index} call refused: {type(exc).__name__}")
                results[i] = exc
                continue
            if fault != "drop_response":
                results[i] = result
        self.sim.run_nested(after)
        return results

    def acknowledge_many(self, calls: Sequence[GetRowsCall]) -> None:
        for call in calls:
            if call.mapper_index in self.unreachable:
                continue
            try:
                self.serve(call)
            except Exception:  # an acknowledgement that fails is harmless
                continue

    def handler(self, address: str) -> MapperWorker | None:
        inst = self.sim.bound.get(address)
        return None if inst is None else inst.worker

    def serve(self, call: GetRowsCall) -> GetRowsResult:
        committed = self.sim.committed_index(call.reducer_index, call.mapper_index)
        if call.committed_row_index > committed:
            # A reducer reports only what it committed: anything beyond is a protocol bug
            # (the mapper's defence may hide its effect, this check does not).
            self.sim.false_claims.append(
                f"r{call.reducer_index} told m{call.mapper_index} it committed up to "
                f"{call.committed_row_index}; the store holds {committed}"
            )
        result = super().serve(call)
        if call.max_rows:
            self.sim.note(
                f"  m{call.mapper_index}@{call.mapper_guid} served r{call.reducer_index} "
                f"({call.committed_row_index}, {result.last_shuffle_row_index}] "
                f"{result.row_count} rows"
            )
        return result

    def deliver_late(self) -> None:
        """A delayed request finally reaches its mapper; nobody waits for the answer."""
        if not self.late:
            return
        call = self.late.popleft()
        if call.mapper_index in self.unreachable:
            return
        with contextlib.suppress(ConnectionError, StaleMapperError, CommittedIndexError):
            self.serve(call)
