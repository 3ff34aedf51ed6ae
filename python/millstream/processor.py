"""The processor: a mapper class, a reducer class, an input, a store and the counts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from millstream.api import Mapper, Reducer, WorkerSpec
from millstream.exceptions import ConfigurationError
from millstream.inputs.base import Input
from millstream.key_groups import DEFAULT_KEY_GROUPS
from millstream.ledger import ProcessorInfo
from millstream.ledger.subspaces import processor_prefix
from millstream.outputs import Output, check_outputs
from millstream.queue_reducer import QueueReducer
from millstream.state import Store, open_store, parse_store_url
from millstream.tuning import Tuning

Delivery = Literal["exactly_once", "at_least_once"]
"""How often a row's effect is applied: exactly once (the default), or at least once."""

DELIVERIES: tuple[Delivery, ...] = ("exactly_once", "at_least_once")


@dataclass(frozen=True)
class Processor:
    """A streaming MapReduce processor.

    Args:
        mapper: The user's :class:`~millstream.Mapper` subclass (importable by module path,
            since workers run in other processes).
        reducer: The user's :class:`~millstream.Reducer` subclass.
        input: A partitioned input, e.g. :class:`~millstream.inputs.ParquetLog`.
        store: State store URL: ``sqlite:///abs/path.db`` or ``fdb://[cluster file]``.
        num_reducers: Number of reducers.
        name: The processor's name; its state lives under this store prefix.
        config: User configuration handed to the mapper and reducer.
        tuning: Worker knobs; see :class:`~millstream.Tuning`.
        delivery: ``"exactly_once"`` (the default): every row's effect is applied once,
            whatever fails. ``"at_least_once"``: mappers record no batch boundaries (one
            store write per mapped batch less, for lower latency), so after a mapper
            instance ends (crash, restart, or a newer instance taking over) the rows it read
            since its last persisted state are read again and applied again by the reducers
            that had committed them. Nothing is lost in either mode; a processor keeps its
            mode for ever. See the README, "Delivery: exactly once or at least once".
        outputs: Where reducers may send rows besides their own keys, atomically with
            their commits: :class:`~millstream.inputs.StoreQueue` queues (another
            processor reading one consumes its rows exactly once; the queue's partitions
            are sealed when this processor drains) and
            :class:`~millstream.outputs.ParquetSink` sinks. They must live in this
            processor's store. Reducers write through
            :meth:`~millstream.Transaction.append` and
            :meth:`~millstream.Transaction.write_parquet`.
        num_mappers: Mapper workers (processes or Spark tasks); 0 (the default): one per
            input partition. Mapper ``m`` reads partitions ``m``, ``m + num_mappers``, ...,
            each with its own window, shuffle numbering and records, so a processor may be
            restarted with another ``num_mappers`` (its partitions move between mappers,
            no row is lost or repeated). The input's partition count is fixed for ever.
        key_groups: Keys hash to this many key groups (fixed when the processor's state is
            created), each reducer owning a contiguous range of them: the most reducers a
            rescale (:func:`millstream.rescale`) can give it. Mappers routing with
            :meth:`~millstream.Partitioned.by_hash` and another value than the default
            pass ``key_groups=self.spec.key_groups``.
    """

    mapper: type[Mapper]
    reducer: type[Reducer]
    input: Input
    store: str
    num_reducers: int
    name: str = "millstream"
    config: Mapping[str, Any] = field(default_factory=dict)
    tuning: Tuning = field(default_factory=Tuning)
    delivery: Delivery = "exactly_once"
    outputs: Sequence[Output] = ()
    num_mappers: int = 0
    key_groups: int = DEFAULT_KEY_GROUPS

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))
        self.validate()
        if self.num_mappers == 0:
            object.__setattr__(self, "num_mappers", self.num_partitions)

    @property
    def num_partitions(self) -> int:
        """The input's partitions: every protocol record, a reducer's progress and the
        shuffle numbering are kept per partition, whichever mapper reads it."""
        return self.input.num_partitions

    def partitions_of(self, mapper_index: int) -> tuple[int, ...]:
        """The input partitions mapper ``mapper_index`` reads."""
        return tuple(range(mapper_index, self.num_partitions, self.num_mappers))

    def validate(self) -> None:
        """Check the configuration before anything starts.

        Raises:
            ConfigurationError: What is wrong and how to fix it.
        """
        if not (isinstance(self.mapper, type) and issubclass(self.mapper, Mapper)):
            raise ConfigurationError(
                f"mapper must be a subclass of millstream.Mapper, got {self.mapper!r}"
            )
        if not (isinstance(self.reducer, type) and issubclass(self.reducer, Reducer)):
            raise ConfigurationError(
                f"reducer must be a subclass of millstream.Reducer, got {self.reducer!r}"
            )
        if not isinstance(self.num_reducers, int) or self.num_reducers < 1:
            raise ConfigurationError(f"num_reducers must be an int >= 1, got {self.num_reducers!r}")
        if not isinstance(self.key_groups, int) or self.key_groups < self.num_reducers:
            raise ConfigurationError(
                f"key_groups ({self.key_groups!r}) must be an int of at least num_reducers "
                f"({self.num_reducers}): every reducer owns one key group or more"
            )
        if not isinstance(self.input, Input):
            raise ConfigurationError(
                "input must have num_partitions and reader(partition), e.g. "
                f"millstream.inputs.ParquetLog; got {self.input!r}"
            )
        parse_store_url(self.store)
        if self.delivery not in DELIVERIES:
            raise ConfigurationError(
                f"delivery must be one of {', '.join(map(repr, DELIVERIES))}, got {self.delivery!r}"
            )
        if self.num_partitions < 1:
            raise ConfigurationError("the input has no partitions, so there is no mapper to run")
        if (
            not isinstance(self.num_mappers, int)
            or isinstance(self.num_mappers, bool)
            or not 0 <= self.num_mappers <= self.num_partitions
        ):
            raise ConfigurationError(
                f"num_mappers must be an int between 1 and the input's {self.num_partitions} "
                f"partitions (0: one mapper per partition), got {self.num_mappers!r}; a mapper "
                "without a partition would have nothing to read"
            )
        if self.delivery == "at_least_once" and issubclass(self.reducer, QueueReducer):
            raise ConfigurationError(
                f"{self.reducer.__name__} is a QueueReducer, which needs exactly-once delivery "
                "(its pending rows are named by their shuffle indices, which only exactly-once "
                "keeps across mapper restarts); drop delivery='at_least_once'"
            )
        check_outputs(self.outputs, self.store)
        if any(
            type(output) is type(self.input)
            and output.name == getattr(self.input, "name", None)
            and output.store.url == getattr(getattr(self.input, "store", None), "url", None)
            for output in self.outputs
        ):
            raise ConfigurationError(
                "a processor cannot append to the queue it reads: its rows would come back "
                "to it for ever; give the output another queue"
            )
        t = self.tuning
        if t.batch_rows < 1 or t.commit_max_rows < 1 or t.commit_max_bytes < 1:
            raise ConfigurationError(
                "tuning.batch_rows, commit_max_rows and commit_max_bytes must be >= 1"
            )
        if t.memory_limit_bytes < 1:
            raise ConfigurationError("tuning.memory_limit_bytes must be >= 1")
        if not 0 < t.commit_time_share <= 1:
            raise ConfigurationError(
                f"tuning.commit_time_share must be in (0, 1], got {t.commit_time_share}"
            )
        if t.commit_max_interval_seconds is not None and (
            t.commit_max_interval_seconds < t.commit_interval_seconds
        ):
            raise ConfigurationError(
                "tuning.commit_max_interval_seconds must be at least commit_interval_seconds "
                f"({t.commit_interval_seconds}), got {t.commit_max_interval_seconds}"
            )
        if t.get_rows_poll_seconds < 0:
            raise ConfigurationError(
                f"tuning.get_rows_poll_seconds must be >= 0, got {t.get_rows_poll_seconds}"
            )
        if t.gather_seconds < 0:
            raise ConfigurationError(
                f"tuning.gather_seconds must be >= 0 (0: never gather), got {t.gather_seconds}"
            )
        if not 0 <= t.get_rows_wait_seconds <= t.rpc_timeout_seconds:
            raise ConfigurationError(
                "tuning.get_rows_wait_seconds must be between 0 and rpc_timeout_seconds "
                f"({t.rpc_timeout_seconds}), got {t.get_rows_wait_seconds}"
            )
        if t.on_user_error not in ("stop", "retry", "dead_letter"):
            raise ConfigurationError(
                "tuning.on_user_error must be 'stop', 'retry' or 'dead_letter', "
                f"got {t.on_user_error!r}"
            )
        if t.dead_letter_max_rows is not None and t.dead_letter_max_rows < 0:
            raise ConfigurationError(
                f"tuning.dead_letter_max_rows must be >= 0 or None, got {t.dead_letter_max_rows}"
            )
        if t.dead_letter_max_share is not None and not 0 <= t.dead_letter_max_share <= 1:
            raise ConfigurationError(
                "tuning.dead_letter_max_share must be in [0, 1] or None, "
                f"got {t.dead_letter_max_share}"
            )
        r = t.restart
        if r.max_restarts < 0 or r.interval_seconds <= 0 or r.backoff_seconds < 0:
            raise ConfigurationError(
                "tuning.restart needs max_restarts >= 0, interval_seconds > 0 and "
                f"backoff_seconds >= 0; got {r!r}"
            )
        if t.get_rows_max_bytes >= t.grpc_max_message_bytes:
            raise ConfigurationError(
                f"tuning.get_rows_max_bytes ({t.get_rows_max_bytes}) must be below "
                f"grpc_max_message_bytes ({t.grpc_max_message_bytes})"
            )

    @property
    def info(self) -> ProcessorInfo:
        """What the store records to refuse a restart with other counts or classes.

        The fingerprint names the classes without their module: the same job is
        ``__main__`` when run as ``python job.py``, ``job`` under ``millstream run
        job.py:processor`` and ``pkg.job`` when imported from a package.
        """
        fingerprint = f"{self.mapper.__qualname__}->{self.reducer.__qualname__}"
        return ProcessorInfo(
            self.num_partitions, self.num_reducers, fingerprint, self.delivery, self.key_groups
        )

    @property
    def at_least_once(self) -> bool:
        """Whether the processor runs in the at-least-once mode."""
        return self.delivery == "at_least_once"

    @property
    def guid(self) -> str:
        """The processor's GUID, derived from its store URL and name (stable across runs)."""
        return uuid.uuid5(uuid.NAMESPACE_URL, f"{self.store}#{self.name}").hex

    def spec(self, role: str, index: int, guid: str) -> WorkerSpec:
        """The specification handed to worker ``index`` of ``role`` (instance ``guid``)."""
        return WorkerSpec(
            self.name,
            role,
            index,
            guid,
            self.num_mappers,
            self.num_reducers,
            self.guid,
            self.num_partitions,
            self.key_groups,
        )

    def open_store(self) -> Store:
        """Open this processor's store under its prefix."""
        return open_store(self.store, prefix=processor_prefix(self.name))
