"""Run millstream on Spark: workers as long-running tasks that Spark restarts.

import millstream.spark as mss

summary = mss.run(spark, processor)             # one job, one task per worker
mss.write_queue(df, queue, close=True)          # DataFrame -> StoreQueue, in parallel
out = mss.read_output(spark, processor, ("sum",))  # reducer output -> DataFrame
"""

from millstream.spark.frames import output_table, read_output, write_queue
from millstream.spark.runner import run, worker_of
from millstream.spark.slots import Slots, available_slots, check_slots, slots_of

__all__ = [
    "Slots",
    "available_slots",
    "check_slots",
    "output_table",
    "read_output",
    "run",
    "slots_of",
    "worker_of",
    "write_queue",
]
