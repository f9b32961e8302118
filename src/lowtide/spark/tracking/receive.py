"""The receive step of a window planned in Spark's JVM: a thin Arrow UDF over the
tracking column only, which acks every row as received out of the window's inbound
segment ``S_in`` and stamps the rows with ``S_in``'s min time (``lt_wm``, ms), the
value Spark's watermark is driven by (:mod:`lowtide.spark.operators.window_plan`).

Per task (rules 5 and 6): the receive-acks of all its rows, XOR-reduced per slot, go
out as ONE keyed batch ``(query id, batch id, "<receive>S_in", partition)`` once its
input is exhausted; the task waits for the tracker's confirmation, then reads ``S_in``'s
min time and hands back its last rows stamped with it (the rows before them carry 0,
which never raises a maximum). Only ``lt_track`` crosses into Python and one long comes
back: the rows' other columns stay in the JVM.

Why a stamp is safe (rule S below). Let ``w`` be a stamp read in micro-batch ``N``:

* a row received in a batch ``M > N`` was not received when ``w`` was read (its
  receive-ack was applied after): it was in flight in ``S_in`` or not yet sent, so its
  slot is ``>= w``. Spark drops a row as late only if its window ends at or below the
  watermark, and the watermark of batch ``M`` is the maximum stamp of batches ``< M``:
  no row is ever dropped;
* every row with a slot ``< w`` was received before ``w`` was read, by a task of batch
  ``<= N`` (a failed attempt's rows are the retry's rows; a batch re-run after a
  restart reads the same offsets), so it is in the state Spark committed with batch
  ``N``; Spark applies the watermark from batch ``N + 1`` on, so a window it emits
  (end ``<=`` watermark) holds every one of its rows.

Attempts may read different stamps: each is a min time of ``S_in``, at most the true
one, and Spark records each batch's watermark in its offset log before the batch runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lowtide.spark.tracking.column import AckAccumulator, reference_slot
from lowtide.spark.tracking.transport import TrackerRef, connect

RECEIVE_PREFIX = "<receive>"
#: the largest stamp, 9999-12-31T23:59:59.999Z (Spark's last timestamp): a min time past
#: it means "nothing more will come" (every front finished)
STAMP_MAX_MS = 253_402_300_799_999


def stamp_ms(min_time: int, delta_ms: int) -> int:
    """The stamp (ms since the epoch) of a min time (a slot).

    >>> stamp_ms(170_000_000_000, 10), stamp_ms(1 << 61, 10) == STAMP_MAX_MS
    (1700000000000, True)
    """
    return min(min_time * delta_ms, STAMP_MAX_MS)


def read_stamp(ref: TrackerRef, segment: str) -> int:
    """``segment``'s min time now, as a stamp (the tracker answers once its clock has
    passed this process's "now": everything confirmed before is in it)."""
    from lowtide.service.clock import wall_ms

    agent: Any = connect(ref)
    return stamp_ms(int(agent.min_time_at(segment, wall_ms())), ref.grid.delta_ms)


def receive_function(ref: TrackerRef, segment: str
                     ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The Arrow UDF body: ``lt_track`` arrays in, ``lt_wm`` arrays (ms) out."""

    def run(arrays: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from lowtide.spark.sources.log_source import submit_task_batch

        idx = ref.graph.index(segment)
        acc = AckAccumulator()
        ref_slot = reference_slot(ref.grid)
        held = -1  # rows of the latest input, handed back once the stamp is known
        for arr in arrays:
            packed = np.asarray(arr.to_numpy(zero_copy_only=False), np.int64)
            acc.add_packed(idx, packed, ref_slot, -1)
            if held >= 0:
                yield pa.array(np.zeros(held, np.int64))
            held = len(packed)
        if held < 0:
            return
        submit_task_batch(ref, RECEIVE_PREFIX + segment, task_partition(), acc).wait()
        yield pa.array(np.full(held, read_stamp(ref, segment), np.int64))

    return run


def task_partition() -> int:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.partitionId() if tc is not None else 0


def receive_column(ref: TrackerRef, segment: str, track: Any) -> Any:
    """The Spark column of the receive step over the tracking column ``track``."""
    import warnings

    from pyspark.sql.functions import ArrowUDFType, arrow_udf

    with warnings.catch_warnings():  # PySpark prefers type hints to the explicit type
        warnings.simplefilter("ignore", UserWarning)
        udf = arrow_udf(receive_function(ref, segment), "long", ArrowUDFType.SCALAR_ITER)
    return udf(track)
