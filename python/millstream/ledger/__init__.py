"""The protocol's ledger: every record millstream keeps in the store, one module per role.

The store (:mod:`millstream.state`) is a plain ordered key-value store; what its keys mean
lives here. Workers, runners, the CLI and Spark read and write the protocol's records
through these modules, never through each other:

- :mod:`.subspaces`: where records live (``SYSTEM``, ``OUTPUT``, ``QUEUES``);
- :mod:`.mapper`: a mapper's persisted state, batch plans, numbering owner, drained
  marker, totals;
- :mod:`.reducer`: a reducer's committed row indices and totals;
- :mod:`.spill`: rows spilled for reducers that fell behind (straggler spill);
- :mod:`.dead_letters`: rows ``map`` or ``reduce`` raised on, set aside with the error;
- :mod:`.discovery`: live workers' entries and their published metrics;
- :mod:`.processor_record`: the processor's counts, key groups and fingerprint, and the
  check that a store holds this processor;
- :mod:`.rescale`: the rescale plan (a rescale's cut) and the transaction that hands the
  key groups to a new number of reducers;
- :mod:`.run`: a run: the store prepared before the workers start, and the run's totals;
- :mod:`.status`: one snapshot of all of it, for ``millstream status`` and progress.
"""

from millstream.key_groups import DEFAULT_KEY_GROUPS
from millstream.ledger.discovery import (
    Metric,
    WorkerInfo,
    freshest_workers,
    list_workers,
    read_statuses,
    register_worker,
    remove_stale_workers,
    unregister_worker,
    write_worker_status,
)
from millstream.ledger.mapper import (
    MapperState,
    clear_batch_plans,
    decode_mapper_state,
    decode_numbering,
    drained_key,
    drained_mappers,
    mapped_key,
    mapper_state_key,
    numbering_key,
    plan_key,
    read_mapper_state,
    read_numbering,
    read_window_schema,
    window_schema_key,
    write_mapper_state,
    write_numbering,
    write_window_schema,
)
from millstream.ledger.processor_record import (
    ProcessorInfo,
    check_processor_info,
    read_processor_info,
    write_processor_info,
)
from millstream.ledger.reducer import (
    ReducerState,
    decode_reducer_state,
    drained_marker_key,
    read_reducer_state,
    reduced_key,
    reducer_state_key,
    write_reducer_state,
)
from millstream.ledger.rescale import RescalePlan, read_rescale
from millstream.ledger.run import RunSummary, prepare_store, summarize
from millstream.ledger.status import REDUCER_ACTIVITIES, read_status
from millstream.ledger.subspaces import OUTPUT, QUEUES, ROLES, SINKS, SYSTEM

__all__ = [
    "DEFAULT_KEY_GROUPS",
    "OUTPUT",
    "QUEUES",
    "REDUCER_ACTIVITIES",
    "ROLES",
    "SINKS",
    "SYSTEM",
    "MapperState",
    "Metric",
    "ProcessorInfo",
    "ReducerState",
    "RescalePlan",
    "RunSummary",
    "WorkerInfo",
    "check_processor_info",
    "clear_batch_plans",
    "decode_mapper_state",
    "decode_numbering",
    "decode_reducer_state",
    "drained_key",
    "drained_mappers",
    "drained_marker_key",
    "freshest_workers",
    "list_workers",
    "mapped_key",
    "mapper_state_key",
    "numbering_key",
    "plan_key",
    "prepare_store",
    "read_mapper_state",
    "read_numbering",
    "read_processor_info",
    "read_reducer_state",
    "read_rescale",
    "read_status",
    "read_statuses",
    "read_window_schema",
    "reduced_key",
    "reducer_state_key",
    "register_worker",
    "remove_stale_workers",
    "summarize",
    "unregister_worker",
    "window_schema_key",
    "write_mapper_state",
    "write_numbering",
    "write_processor_info",
    "write_reducer_state",
    "write_window_schema",
    "write_worker_status",
]
