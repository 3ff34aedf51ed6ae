"""Run millstream on Spark: workers as long-running tasks that Spark restarts.

import millstream.spark as mss

summary = mss.run(spark, processor)             # one job, one task per worker
mss.write_queue(df, queue, close=True)          # DataFrame -> StoreQueue, in parallel
out = mss.read_output(spark, processor, ("sum",))  # reducer output -> DataFrame
"""

from millstream.spark.frames import output_table, read_output, write_queue
from millstream.spark.hosts import Deployment, check_deployment, executor_host, is_local_master
from millstream.spark.launch import run, worker_of
from millstream.spark.slots import Slots, available_slots, check_slots, slots_of, wait_for_slots

__all__ = [
    "Deployment",
    "Slots",
    "available_slots",
    "check_deployment",
    "check_slots",
    "executor_host",
    "is_local_master",
    "output_table",
    "read_output",
    "run",
    "slots_of",
    "wait_for_slots",
    "worker_of",
    "write_queue",
]
