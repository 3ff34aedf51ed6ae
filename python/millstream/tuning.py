"""Configuration of the workers: the knobs of the algorithm (thesis 4.5).

The user's own configuration is a plain mapping passed to the processor (``config=``) and
handed to every mapper and reducer as ``self.config``.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass, field
from typing import Literal

from millstream.backoff import exponential_delay


@dataclass(frozen=True)
class RestartStrategy:
    """How the local runner restarts a worker process that died (Flink's failure-rate
    restart strategy, with exponential backoff).

    A dead worker is started again after ``backoff_seconds``, doubled for each earlier
    death within the last ``interval_seconds``, at most ``backoff_max_seconds``. A worker
    that dies more than ``max_restarts`` times within ``interval_seconds`` is in a crash
    loop that restarting will not end: the run stops with a
    :class:`~millstream.exceptions.CrashLoopError` naming the worker and its last error.
    With the defaults a worker that fails at every start stops the run in about ten
    seconds. Failures that no restart can cure stop the run at once,
    whatever this says: the user's module failing to import in the worker, a configuration
    error, a ``map`` or ``reduce`` that raises (``on_user_error="stop"``), a corrupt input.

    Attributes:
        max_restarts: Deaths of one worker within the interval that are still restarted.
        interval_seconds: How far back deaths count.
        backoff_seconds: Wait before the first restart.
        backoff_max_seconds: Longest wait before a restart.
        window_seconds: Deprecated name of ``interval_seconds`` (a window is a mapper's
            buffer of rows): given, it sets ``interval_seconds``.
    """

    max_restarts: int = 10
    interval_seconds: float = 60.0
    backoff_seconds: float = 0.05
    backoff_max_seconds: float = 2.0
    window_seconds: InitVar[float | None] = None

    def __post_init__(self, window_seconds: float | None) -> None:
        if window_seconds is not None:
            warnings.warn(
                "RestartStrategy(window_seconds=...) is deprecated: use interval_seconds",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "interval_seconds", window_seconds)

    def backoff(self, deaths: int) -> float:
        """Seconds to wait before restarting a worker that died ``deaths`` times lately."""
        return exponential_delay(self.backoff_seconds, self.backoff_max_seconds, deaths - 1)


@dataclass(frozen=True)
class Tuning:
    """Knobs of the workers. The defaults suit the embedded store on one machine.

    Attributes:
        batch_rows: Rows a mapper reads per batch, at most (a stream's reads take what
            has arrived): about a million keep per-batch overhead small and let a
            pre-aggregating ``map`` combine most rows, whose own cost is per distinct key
            of a batch (100,000 keys: 20 M rows become 2.0 M shuffled with 1,048,576, 7.1
            M with 262,144; the whole job then takes half the CPU per row). Wide rows are
            read in fewer: a batch takes at most a quarter of ``memory_limit_bytes``, as
            read or as mapped, and a mapper's first read at most 65,536 rows.
        memory_limit_bytes: Buffered bytes in a mapper's window above which it stops
            reading until reducers commit.
        commit_interval_seconds: Time between a reducer's commits, from the start of a
            round that committed to the start of the next (from its first answer if the
            round waited for rows; a tenth sooner if its rows were already waiting, so
            that rounds keep in step with rows that arrive once an interval). Rows keep
            accumulating in the mappers' windows meanwhile and are fetched and committed in
            one transaction: a longer interval writes less per row (every commit rewrites
            the touched keys and syncs the log), a shorter one lowers latency.
        commit_time_share: The share of a reducer's time its transactions (``reduce`` and
            the commit) may take: when commits get expensive (many keys, a big store), the
            reducer waits longer between them so that more rows fold into each, up to
            ``commit_max_interval_seconds``. Cheap commits keep ``commit_interval_seconds``.
            0.5 keeps the append-to-commit latency of a stream at half of peak load where
            it was with a fixed interval; 0.25 writes less (fewer, larger commits) but adds
            a commit's time to that latency.
        commit_max_interval_seconds: The longest wait between commits that
            ``commit_time_share`` may choose; None: five times ``commit_interval_seconds``.
        commit_max_rows: Rows one reducer transaction takes, split across the mappers.
        commit_max_bytes: Arrow bytes one reducer transaction takes, split across the
            mappers. If the user's writes still exceed the store's transaction limit, the
            reducer halves its fetch and retries.
        get_rows_max_bytes: Payload bytes of one GetRows response (below the gRPC limit).
        trim_period_seconds: How often a mapper persists its state and trims its input.
        idle_seconds: Wait after a loop iteration that found nothing to do. A mapper whose
            reader can wait for rows (:class:`~millstream.inputs.WaitingReader`: a
            :class:`~millstream.inputs.StoreQueue` wakes its readers when an append
            commits) sleeps until rows arrive, at most this long at first, twice as long
            each time nothing came, up to 0.1 s (or ``trim_period_seconds``); a reducer
            whose round found nothing sleeps until a mapper answers the call it holds, at
            most this long, doubled the same way up to 0.1 s (or
            ``commit_interval_seconds``).
        backoff_seconds: First wait after an error (store unreachable, conflict, mapper
            down); doubled on every further error up to ``backoff_max_seconds``.
        backoff_max_seconds: Longest wait between retries.
        heartbeat_seconds: How often workers refresh discovery and publish their status.
        rpc_timeout_seconds: Deadline of one GetRows call.
        get_rows_poll_seconds: How long a mapper holds a reducer's GetRows for which it has
            no rows, answering as soon as rows arrive: an idle processor makes one call per
            reducer and mapper this often instead of polling (at most half of
            ``rpc_timeout_seconds``).
        get_rows_wait_seconds: How long a reducer's round waits for its mappers' answers
            before it commits the rows it has (a round that has none by then takes the
            first answer when it comes). A mapper that answers later (frozen, overloaded)
            holds nobody: its call stays under way and its answer is used in a later round
            (thesis 4.4: a slow partition does not hold the others). A few milliseconds,
            with a short ``commit_interval_seconds``, commit each mapper's rows as they
            come instead of waiting for every mapper's: lower latency on a light stream
            (6,250 rows/s on two mappers whose input arrives in turns: p50 6-7 ms against
            14-15), more commits (worse at half of peak load on two cores).
        gather_seconds: While its mappers are behind their input (their last reads filled
            whole batches: a backlog, a replay, a bounded input read at full speed), how
            long a reducer lets each mapper hold its GetRows until a full commit's worth of
            rows (``commit_max_rows``, ``commit_max_bytes``) waits for it, the mapper
            catches up, or its window is half full. The reducer then commits few, large
            transactions, rewriting each touched key once per transaction instead of once
            per small commit, as a micro-batch engine does when it falls behind. A reducer
            whose mappers keep up commits on the usual cadence. 0: never gather.
        spill_after_seconds: Straggler spill: a reducer that has not called GetRows for
            this long (down, hung, cut off) is a straggler; while its window is full, a
            mapper writes to the store the rows it holds only for stragglers (from its
            oldest entries that another reducer has moved past), so that it reads on and
            the other reducers keep committing; a straggler reads those rows from the store
            when it returns (thesis section 6). Longer than a reducer's longest quiet spell
            in normal work (a held GetRows, ``gather_seconds``; a commit). None: never
            spill (a full window holds the mapper until every reducer commits).
        split_brain_delay_seconds: Wait before a mapper restarts ingestion after it saw
            another instance write its state.
        grpc_max_message_bytes: gRPC send/receive limit on both sides.
        advertise_host: Address a mapper publishes in discovery for reducers to dial.
            ``None``: the local runner uses ``127.0.0.1``; on Spark, the executor's own
            address (``SPARK_LOCAL_IP``, else ``SPARK_EXECUTOR_POD_IP``, else the address of
            the interface that routes to the driver). Set it when the executors reach each
            other under another name (NAT, several interfaces).
        bind_host: Address the mapper's GetRows server listens on. ``None``: the advertised
            address only; ``"0.0.0.0"`` (or ``"::"``) for every interface, e.g. when the
            advertised address belongs to a proxy or NAT in front of the host. Beyond
            loopback, GetRows needs mutual TLS (``tls_*``) or ``plaintext_get_rows``.
        tls_ca_file: Mutual TLS on GetRows: the CA certificate (PEM) that signs every
            worker's certificate. With ``tls_cert_file`` and ``tls_key_file`` (all three or
            none; unset: ``MILLSTREAM_TLS_CA_FILE``, ``MILLSTREAM_TLS_CERT_FILE``,
            ``MILLSTREAM_TLS_KEY_FILE``), mappers serve only callers with a certificate
            the CA signed and reducers check the mappers'. See the README, "Securing GetRows".
        tls_cert_file: This worker's certificate (PEM), signed by the CA.
        tls_key_file: Its private key (PEM).
        tls_server_name: The name reducers expect in mappers' certificates, when those
            name a service rather than each host (``MILLSTREAM_TLS_SERVER_NAME``); None:
            the host of the address a mapper advertises.
        plaintext_get_rows: Allow GetRows without TLS on an address other hosts may
            reach (anything but loopback: a ``bind_host`` such as ``"0.0.0.0"``, an
            executor's address on Spark), where anyone who reaches a mapper's port could
            make it drop rows (it then produces them again; nothing is lost). Every runner
            refuses that without TLS unless this is set; plaintext on loopback (the local
            runner's default) is always allowed.
        acknowledge_commits: After each commit, tell the mappers the new committed
            indices at once instead of with the next round, so they free memory and trim
            their input a commit interval sooner: the next round's GetRows go out right
            after the commit (and the reducer's ``on_commit``) and carry them (each mapper
            answers when the round starts, with the rows that came meanwhile). A reducer
            that is behind (its next round starts at once), one with ``pipeline_fetch`` and
            a queue reducer send GetRows for 0 rows instead.
        pipeline_fetch: Fetch the next rows while ``reduce`` and the commit of the last
            ones run: the GetRows calls for after the rows being reduced start before the
            transaction, and their answers serve the next round if the commit landed
            (they continue from its committed indices; otherwise they are dropped). At most
            one transaction is in flight per reducer either way. Off by default: on one
            machine with the embedded store it adds latency (the next round gets the rows
            there were when the commit began, not when it ended: p99 115-126 ms against
            75-87 at 62,500 rows/s) and no throughput; it pays where moving the rows takes
            about as long as a commit (remote mappers, large rows).
        on_user_error: ``"stop"``: a ``map`` or ``reduce`` that raises stops the worker
            (and a local run) with the row range in the error; ``"retry"``: the worker logs
            it, backs off and retries the same rows; ``"dead_letter"``: the batch is
            bisected down to the rows the code raises on alone, which go to the store's
            dead-letter queue once each (``millstream dead-letters``), and the rest go on
            (:mod:`millstream.ledger.dead_letters`). A batch that raises costs about
            ``2 k log2(n / k)`` more calls for ``k`` bad rows of ``n``; one that does not
            raise costs nothing more. A ``QueueReducer``'s ``process`` is bisected over
            its pending rows; a row it raises on becomes a dead letter in the commit that
            finishes it.
        dead_letter_max_rows: With ``"dead_letter"``, the most dead letters the processor
            may hold (both stages, all workers): a batch that would take it past them
            stops the run with :class:`~millstream.exceptions.DeadLetterCapError`, nothing
            of that batch committed. None: no limit.
        dead_letter_max_share: With ``"dead_letter"``, the largest share of a worker's
            rows (a mapper's input rows, a reducer's rows) that may be dead letters, from
            its first batch on; past it the run stops as above. None: no limit.
        restart: How the local runner restarts dead workers and when it gives up; see
            :class:`RestartStrategy`. The Spark runner leaves single failures to Spark's
            task retries and applies it to jobs: one that failed (a task failed
            ``spark.task.maxFailures`` times) is submitted again with this backoff and
            limit, so a stream outlives failures far apart.
    """

    batch_rows: int = 1_048_576
    memory_limit_bytes: int = 256 * 1024 * 1024
    commit_interval_seconds: float = 0.2
    commit_time_share: float = 0.5
    commit_max_interval_seconds: float | None = None
    commit_max_rows: int = 4_000_000
    commit_max_bytes: int = 64 * 1024 * 1024
    get_rows_max_bytes: int = 32 * 1024 * 1024
    trim_period_seconds: float = 1.0
    idle_seconds: float = 0.01
    backoff_seconds: float = 0.05
    backoff_max_seconds: float = 2.0
    heartbeat_seconds: float = 1.0
    rpc_timeout_seconds: float = 10.0
    get_rows_poll_seconds: float = 1.0
    get_rows_wait_seconds: float = 0.1
    gather_seconds: float = 2.0
    spill_after_seconds: float | None = 10.0
    split_brain_delay_seconds: float = 0.5
    grpc_max_message_bytes: int = 64 * 1024 * 1024
    advertise_host: str | None = None
    bind_host: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None
    plaintext_get_rows: bool = False
    acknowledge_commits: bool = True
    pipeline_fetch: bool = False
    on_user_error: Literal["stop", "retry", "dead_letter"] = "stop"
    dead_letter_max_rows: int | None = 1_000
    dead_letter_max_share: float | None = None
    restart: RestartStrategy = field(default_factory=RestartStrategy)


__all__ = ["RestartStrategy", "Tuning"]
