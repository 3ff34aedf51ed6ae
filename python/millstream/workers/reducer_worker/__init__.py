"""The reducer worker (thesis 4.4.2): one :class:`ReducerWorker` per reducer index, a thin
loop over the steps of its rounds, one module each.

- :mod:`.worker`: :class:`ReducerWorker`: the view a round starts from, and the loop;
- :mod:`.instance`: one instance's state and counters;
- :mod:`.fetch`, :mod:`.fetch_sizing`: a round's GetRows, and how much they ask for;
- :mod:`.round_record`: :class:`Round`, what a round commits besides the user's writes;
- :mod:`.plain_round`: a :class:`~millstream.Reducer`'s round;
- :mod:`.queue_round`, :mod:`.pending_queue`: a :class:`~millstream.QueueReducer`'s round
  and its pending rows;
- :mod:`.spill_reads`: rows mappers spilled for this reducer, read from the store;
- :mod:`.ipc_decode`: the mappers' Arrow IPC answers as one batch;
- :mod:`.commit`: the reducer's commit; :mod:`.settling`: commits of unknown outcome;
- :mod:`.cadence`: the wait between commits;
- :mod:`.drain`: the end of a run;
- :mod:`.figures`: the figures ``millstream status`` shows.
"""

from millstream.workers.reducer_worker.round_record import Round
from millstream.workers.reducer_worker.worker import ReducerWorker

__all__ = ["ReducerWorker", "Round"]
