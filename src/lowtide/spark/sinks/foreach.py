"""The ``foreachBatch`` sink: :class:`TrackedForeachBatch` acks a batch's rows as
received after the user's function committed them (receive-acks computed in the JVM).
Also how a sink's acks are sent (:func:`send_sink_acks`: a tracker that does not
confirm them stops the query with one line), the per-task trace lines benches read, and
unpacking ``lt_track`` into ``lt_time`` and ``lt_ack`` for outputs that keep the
tracking columns."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lowtide.core.errors import LowtideError
from lowtide.spark.tracking.column import (
    ACK_COL,
    ID_BITS,
    ID_MASK,
    TIME_COL,
    TRACK_COL,
    UNWRAP_RANGE,
    AckAccumulator,
    as_u64,
    plan_reference_slot,
    reference_slot,
    unwrap,
)
from lowtide.spark.tracking.transport import (
    HOLD_WAIT_S,
    TrackerRef,
    batch_key,
    connect,
    tracker_silent,
)


def append_trace(path: str, batch_id: int, started_ns: int, rows: int) -> None:
    """One line of a sink's trace (benchmarks): ``<batch> <ack start ns> <acks confirmed
    ns> <rows>``, written once the acks are confirmed."""
    with open(path, "a") as f:
        f.write(f"{batch_id} {started_ns} {time.time_ns()} {rows}\n")


OnFailure = Callable[[LowtideError], None]


class SinkAcksFailed(LowtideError, RuntimeError):
    """A sink's acks were not confirmed within ``hold_wait_s``: its query stopped."""


def send_sink_acks(ref: TrackerRef, segment: str, query: str, batch_id: int, acks: Any, *,
                   wait_s: float = HOLD_WAIT_S, on_failure: OnFailure | None = None,
                   what: str | None = None, partition: int = 0) -> None:
    """Send the sink's acks of a batch (on the driver, in ``foreachBatch``). A tracker
    that does not confirm them within ``wait_s`` ends the batch with
    :class:`SinkAcksFailed`, one line handed first to ``on_failure`` (the query's
    ``fail``): the batch is not committed, so the query's restart re-sends its acks under
    the same key (rule 6), and the sink's min time never passed them (fail closed).
    ``what``: the sender in that line (default: the sink ``segment``); ``partition``:
    of the batch's key, for a sender on the driver besides the tasks of ``segment``."""
    try:
        connect(ref).send_batch(batch_key(query, batch_id, segment, partition), acks,
                                timeout_s=wait_s)
    except TimeoutError:
        error = SinkAcksFailed(tracker_silent(
            what or f"sink {segment!r}", ref.url, f"confirm the acks of batch {batch_id}",
            wait_s, "the query stopped and commits nothing past that batch"))
        if on_failure is not None:
            on_failure(error)
        raise error from None


def query_id(spark_context: Any) -> str:
    q = spark_context.getLocalProperty("sql.streaming.queryId")
    if q is None:
        raise RuntimeError("tracked sinks run inside a streaming query's foreachBatch")
    return str(q)


class TrackedForeachBatch:
    """``foreachBatch`` function that acks the sink segment after ``fn`` returns."""

    def __init__(
        self,
        fn: Callable[[Any, int], Any] | None,
        ref: TrackerRef,
        segment: str,
        *,
        keep_tracking_columns: bool = False,
        trace_file: str | None = None,
        wait_s: float = HOLD_WAIT_S,
        on_failure: OnFailure | None = None,
    ) -> None:
        self.fn = fn
        self.wait_s, self.on_failure = wait_s, on_failure
        self.ref = ref
        self.segment = segment
        self.keep = keep_tracking_columns
        self.last_acks: Any = None
        self.trace = trace_file

    def acks_of(self, df: Any) -> AckAccumulator:
        from pyspark.sql import functions as F

        rows = (
            df.groupBy(F.shiftright(TRACK_COL, ID_BITS))
            .agg(F.bit_xor(TRACK_COL).alias("x"), F.count(F.lit(1)).alias("n"))
            .collect()
        )
        acc = AckAccumulator()
        if rows:
            t = unwrap(np.array([r[0] for r in rows], np.int64), reference_slot(self.ref.grid))
            x = as_u64(np.array([r[1] for r in rows], np.int64)) & ID_MASK
            n = np.array([r[2] for r in rows], np.int64)
            acc.add_reduced(self.ref.graph.index(self.segment), t, x, -n)
        return acc

    def receive_packed(self, packed: Any, query: str, batch_id: int) -> None:
        """Ack the receipt of rows whose tracking column is ``packed`` (numpy), handed
        over on the driver: the null sink of a step that ran there."""
        acc = AckAccumulator()
        if len(packed):
            acc.add_packed(self.ref.graph.index(self.segment), packed,
                           reference_slot(self.ref.grid), -1)
        self._ack(query, batch_id, acc)

    def __call__(self, df: Any, batch_id: int) -> None:
        query = query_id(df.sparkSession.sparkContext)
        if self.fn is None:  # nothing to commit: ack straight from one aggregation job
            self._ack(query, batch_id, self.acks_of(df))
            return
        cached = df.persist()
        try:
            acc = self.acks_of(cached)
            user_df = (unpacked_columns(cached, plan_reference_slot(self.ref.grid))
                       if self.keep else cached.drop(TRACK_COL))
            self.fn(user_df, batch_id)
            self._ack(query, batch_id, acc)
        except BaseException:
            # the error in flight is the batch's: a failed ack stops the query, and the
            # stop may interrupt this clean-up (an InterruptedException through py4j)
            with contextlib.suppress(Exception):
                cached.unpersist()
            raise
        cached.unpersist()

    def _ack(self, query: str, batch_id: int, acc: AckAccumulator) -> None:
        started_ns = time.time_ns()
        acks = acc.build(self.ref.grid.window_slots)
        if len(acks):
            send_sink_acks(self.ref, self.segment, query, batch_id, acks, wait_s=self.wait_s,
                           on_failure=self.on_failure)
        self.last_acks = acks
        if self.trace:
            append_trace(self.trace, batch_id, started_ns, acc.rows_received)


def unpacked_columns(df: Any, ref_slot: int) -> Any:
    """``df`` with ``lt_time`` and ``lt_ack`` in place of ``lt_track`` (Spark columns;
    :func:`lowtide.spark.tracking.unwrap` as an expression)."""
    from pyspark.sql import functions as F

    base = ref_slot - UNWRAP_RANGE
    c = F.col(TRACK_COL)
    slot = F.lit(base) + (F.shiftright(c, ID_BITS) - F.lit(base)).bitwiseAND(F.lit(int(ID_MASK)))
    return (df.withColumn(TIME_COL, slot).withColumn(ACK_COL, c.bitwiseAND(F.lit(int(ID_MASK))))
            .drop(TRACK_COL))


def console_writer(num_rows: int = 20, truncate: bool = True) -> Callable[[Any, int], None]:
    def show(df: Any, batch_id: int) -> None:
        print(f"-------- lowtide batch {batch_id} --------")
        df.show(num_rows, truncate=truncate)

    return show
