"""Tracked sinks: receipt is acked only after the batch is committed.

The sink's input segment is the last segment of the pipeline, so its min time is
end-to-end completeness: every row with time < t has been committed at the sink.

Two mechanisms:

* :class:`TrackedForeachBatch` wraps a ``foreachBatch`` function. It caches the
  batch, computes the receive-acks in the JVM (grouped by the slot bits of
  ``lt_track``, with ``bit_xor`` and ``count``; no Python pass over the rows), runs
  the user's function (which commits), then sends one batch keyed
  ``(query id, batch id, sink segment, 0)``.
  The console sink is built on it, and so is the null sink after an untracked step
  (no user function: the aggregation alone). The null sink right after a tracked
  operator is no sink object at all: Spark's ``noop`` sink, and the operator's
  tasks ack the rows as received (see ``Stream.to_null``).
* ``format("lowtide_sink")``: a Python data source stream writer (Arrow). Each task
  writes its rows (``mode=parquet``: a Parquet file per (batch, partition), named
  deterministically, so a re-run batch overwrites instead of duplicating;
  ``mode=null``: drops them) and returns its per-time XORs in its commit message;
  the driver-side ``commit`` publishes the files and then sends the acks.

With ``keep_tracking_columns`` the output has ``lt_time`` (the row's full slot) and
``lt_ack`` (its 32-bit ack id) instead of the packed ``lt_track``.

A failed batch sends nothing: the acks of a batch go out only after its commit. (The
null sink after a tracked operator commits nothing and is no object here: that
operator's tasks ack it, see ``lowtide.spark.operators.ack_null_sink``.)
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.tracking import (
    ACK_COL,
    ID_BITS,
    ID_MASK,
    TIME_COL,
    TRACK_COL,
    UNWRAP_RANGE,
    AckAccumulator,
    ack_ids,
    as_u64,
    reference_slot,
    slots_of,
    unwrap,
)
from lowtide.spark.transport import TrackerRef, batch_key, connect

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamArrowWriter = WriterCommitMessage = object  # type: ignore

SINK_MODES = ("parquet", "null")


def append_trace(path: str, batch_id: int, started_ns: int, rows: int) -> None:
    """One line of a sink's trace (benchmarks): ``<batch> <ack start ns> <acks confirmed
    ns> <rows>``, written once the acks are confirmed."""
    with open(path, "a") as f:
        f.write(f"{batch_id} {started_ns} {time.time_ns()} {rows}\n")


def _query_id(spark_context: Any) -> str:
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
        query = _query_id(df.sparkSession.sparkContext)
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


# ------------------------------------------------------------------ data source writer
def _with_unpacked(batch: Any, packed: np.ndarray, ref_slot: int) -> Any:
    import pyarrow as pa

    batch = batch.append_column(TIME_COL, pa.array(slots_of(packed, ref_slot)))
    return batch.append_column(ACK_COL, pa.array(ack_ids(packed).astype(np.int64)))


@dataclass
class SinkCommit(WriterCommitMessage):  # type: ignore[misc]
    query: str
    partition: int
    rows: int
    tmp_file: str | None
    times: list[int]
    xors: list[int]
    counts: list[int]


def _final_name(batch_id: int, partition: int) -> str:
    return f"part-{batch_id:010d}-{partition:05d}.parquet"


class SinkWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, options: dict[str, str], schema: Any) -> None:
        self.mode = options.get("mode", "parquet")
        if self.mode not in SINK_MODES:
            raise ValueError(f"lowtide_sink mode must be one of {SINK_MODES}")
        self.path = options.get("path")
        if self.mode == "parquet" and not self.path:
            raise ValueError("lowtide_sink mode=parquet needs a path")
        self.keep = options.get("keeptrackingcolumns", "false").lower() == "true"
        self.ref = TrackerRef.from_option(options["lowtide.tracker"])
        self.segment = options["lowtide.segment"]
        self.trace = options.get("tracefile")

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        tc = TaskContext.get()
        query = tc.getLocalProperty("sql.streaming.queryId") if tc else None
        partition = tc.partitionId() if tc else 0
        acc = AckAccumulator()
        seg = self.ref.graph.index(self.segment)
        ref_slot = reference_slot(self.ref.grid)
        writer = None
        tmp: str | None = None
        rows = 0
        try:
            for batch in iterator:
                i = batch.schema.names.index(TRACK_COL)
                packed = np.asarray(batch.column(i).to_numpy(), np.int64)
                acc.add_packed(seg, packed, ref_slot, -1)
                rows += len(packed)
                if self.mode == "parquet" and batch.num_rows:
                    batch = batch.remove_column(i)
                    if self.keep:
                        batch = _with_unpacked(batch, packed, ref_slot)
                    if writer is None:
                        import pyarrow.parquet as pq

                        tmp_dir = Path(self.path) / "_tmp"  # type: ignore[arg-type]
                        tmp_dir.mkdir(parents=True, exist_ok=True)
                        tmp = str(tmp_dir / f"{partition:05d}-{uuid.uuid4().hex}.parquet")
                        writer = pq.ParquetWriter(tmp, batch.schema)
                    writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
        acks = acc.build(self.ref.grid.window_slots)
        return SinkCommit(
            str(query),
            partition,
            rows,
            tmp,
            acks.time.tolist(),
            acks.xor.tolist(),
            acks.count.tolist(),
        )

    def commit(self, messages: list[SinkCommit | None], batchId: int) -> None:
        started_ns = time.time_ns()
        done = [m for m in messages if m is not None]
        if self.mode == "parquet":
            for m in done:
                if m.tmp_file is not None:
                    os.replace(m.tmp_file, Path(self.path) / _final_name(batchId, m.partition))  # type: ignore[arg-type]
        acc = AckAccumulator()
        seg = self.ref.graph.index(self.segment)
        for m in done:
            acc.add_reduced(
                seg,
                np.array(m.times, np.int64),
                np.array(m.xors, np.uint64),
                np.array(m.counts, np.int64),
            )
        acks = acc.build(self.ref.grid.window_slots)
        if len(acks):
            query = next(m.query for m in done if m.rows)
            connect(self.ref).send_batch(batch_key(query, batchId, self.segment, 0), acks)
        if self.trace:
            append_trace(self.trace, batchId, started_ns, sum(m.rows for m in done))

    def abort(self, messages: list[SinkCommit | None], batchId: int) -> None:
        for m in messages:
            if m is not None and m.tmp_file is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(m.tmp_file)


class TrackedSink(DataSource):  # type: ignore[misc]
    """``df.writeStream.format("lowtide_sink")``; see :mod:`lowtide.spark.sinks`."""

    @classmethod
    def name(cls) -> str:
        return "lowtide_sink"

    def schema(self) -> str:
        return f"{TRACK_COL} long"

    def streamWriter(self, schema: Any, overwrite: bool) -> SinkWriter:
        return SinkWriter({k.lower(): v for k, v in self.options.items()}, schema)
