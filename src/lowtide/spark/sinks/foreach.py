"""The ``foreachBatch`` sink: :class:`TrackedForeachBatch` acks a batch's rows as
received after the user's function committed them (receive-acks computed in the JVM).
Also the per-task trace lines benches read, and unpacking ``lt_track`` into
``lt_time`` and ``lt_ack`` for outputs that keep the tracking columns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lowtide.spark.tracking.column import (
    ACK_COL,
    ID_BITS,
    ID_MASK,
    TIME_COL,
    TRACK_COL,
    UNWRAP_RANGE,
    AckAccumulator,
    as_u64,
    reference_slot,
    unwrap,
)
from lowtide.spark.tracking.transport import TrackerRef, batch_key, connect


def append_trace(path: str, batch_id: int, started_ns: int, rows: int) -> None:
    """One line of a sink's trace (benchmarks): ``<batch> <ack start ns> <acks confirmed
    ns> <rows>``, written once the acks are confirmed."""
    with open(path, "a") as f:
        f.write(f"{batch_id} {started_ns} {time.time_ns()} {rows}\n")


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
    ) -> None:
        self.fn = fn
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

    def __call__(self, df: Any, batch_id: int) -> None:
        query = query_id(df.sparkSession.sparkContext)
        if self.fn is None:  # nothing to commit: ack straight from one aggregation job
            self._ack(query, batch_id, self.acks_of(df))
            return
        cached = df.persist()
        try:
            acc = self.acks_of(cached)
            user_df = (unpacked_columns(cached, reference_slot(self.ref.grid)) if self.keep
                       else cached.drop(TRACK_COL))
            self.fn(user_df, batch_id)
            self._ack(query, batch_id, acc)
        finally:
            cached.unpersist()

    def _ack(self, query: str, batch_id: int, acc: AckAccumulator) -> None:
        started_ns = time.time_ns()
        acks = acc.build(self.ref.grid.window_slots)
        if len(acks):
            key = batch_key(query, batch_id, self.segment, 0)
            connect(self.ref).send_batch(key, acks)
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
