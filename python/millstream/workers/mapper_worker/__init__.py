"""The mapper worker (thesis 4.3): one :class:`MapperWorker` per input partition, a thin
loop over its steps, one module each.

- :mod:`.worker`: :class:`MapperWorker`, its state and the loop;
- :mod:`.window_service`: serving GetRows from the window (thesis 4.3.4);
"""

from millstream.workers.mapper_worker.worker import MapperWorker

__all__ = ["MapperWorker"]
