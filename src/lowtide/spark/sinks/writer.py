"""``format("lowtide_sink")``: a Python data source stream writer. Each task writes
its rows (``mode=parquet``: one file per (batch, partition), written aside; ``mode=null``:
drops them) and returns its per-time XORs in its commit message; the driver-side commit
publishes the files under names that carry the query's id, records the batch with the
digest of its rows (:mod:`lowtide.spark.sinks.batches`), then sends the acks."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.sinks.batches import BatchFiles, digest
from lowtide.spark.sinks.foreach import append_trace
from lowtide.spark.tracking.column import (
    ACK_COL,
    TIME_COL,
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    reference_slot,
    slots_of,
)
from lowtide.spark.tracking.transport import TrackerRef, batch_key, connect

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
except ImportError:  # pragma: no cover
    DataSource = DataSourceStreamArrowWriter = WriterCommitMessage = object  # type: ignore

SINK_MODES = ("parquet", "null")


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
            if self.mode == "parquet":
                self._publish(done, query, batchId, digest(acks.time, acks.xor, acks.count))
            connect(self.ref).send_batch(batch_key(query, batchId, self.segment, 0), acks)
        if self.trace:
            append_trace(self.trace, batchId, started_ns, sum(m.rows for m in done))

    def _publish(self, done: list[SinkCommit], query: str, batch_id: int,
                 rows_digest: str) -> None:
        """The tasks' files under this run's names, unless a re-run of the batch finds
        them committed already with exactly these rows."""
        staged = [(Path(m.tmp_file), f"{m.partition:05d}") for m in done if m.tmp_file]
        files = BatchFiles(Path(self.path), query, batch_id)  # type: ignore[arg-type]
        if files.committed(rows_digest):
            for path, _part in staged:
                path.unlink()
        else:
            files.publish(staged, rows_digest)

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
