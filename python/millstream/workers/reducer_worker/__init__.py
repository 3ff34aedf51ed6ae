"""The reducer worker (thesis 4.4.2): one :class:`ReducerWorker` per reducer index, a thin
loop over its steps, one module each.

- :mod:`.worker`: :class:`ReducerWorker`, its state and the loop;
"""

from millstream.workers.reducer_worker.worker import ReducerWorker, Round

__all__ = ["ReducerWorker", "Round"]
