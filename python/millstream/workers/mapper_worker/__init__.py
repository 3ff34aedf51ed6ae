"""The mapper worker (thesis 4.3): one :class:`MapperWorker` per input partition, a thin
loop over its steps, one module each.

- :mod:`.worker`: :class:`MapperWorker` and its loop;
- :mod:`.instance`: one instance's state, and the check of its persisted state;
- :mod:`.ingest`: reading, numbering and batch plans (thesis 4.3.3);
- :mod:`.window_service`: GetRows served from the window (thesis 4.3.4);
- :mod:`.straggler_spill`: rows held only for silent reducers, written to the store;
- :mod:`.trim`: trim window entries and trim input rows (thesis 4.3.5);
- :mod:`.drain`: the end of a bounded input.

The checks that fence off a second instance: :mod:`millstream.workers.fencing`.
"""

from millstream.workers.mapper_worker.worker import MapperWorker

__all__ = ["MapperWorker"]
