"""``write_parquet``: a ``foreachBatch`` function, :class:`ParquetSink`. In one Spark
job per batch (a ``mapInArrow`` collected on the driver) each task writes its rows to
one Parquet file aside (``_tmp/<query>-<batch>/``) and returns its per-slot XORs and
counts; the driver then publishes the files under names that carry the query's id,
records the batch with the digest of its rows (:mod:`lowtide.spark.sinks.batches`), and
sends the acks.

What is staged and not published goes: at the end of the batch's call; when a batch
runs again (what an attempt killed with its process left); and when the query stops
(:meth:`ParquetSink.close`, after its tasks are gone: a stop that cancels the batch's
job can leave a task writing after the call has returned).

Why not a Python data source writer (what it was): Spark makes two driver-side Python
planner calls a batch for one (plan the write, commit it), each kind in a daemon of its
own started in the first batch (a fresh interpreter importing pyspark); a
``foreachBatch`` function runs in the driver's own Python process."""

from __future__ import annotations

import contextlib
import functools
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.core.time import TimeGrid
from lowtide.spark.sinks.batches import BatchFiles, digest
from lowtide.spark.sinks.foreach import OnFailure, query_id, send_sink_acks
from lowtide.spark.tracking.column import (
    ACK_COL,
    TIME_COL,
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    as_u64,
    reference_slot,
    slots_of,
)
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef

#: what each task of a batch returns: its file (none without rows) and its receipts
STAGED = ("partition int, rows long, staged string, "
          "times array<long>, xors array<long>, counts array<long>")
TMP = "_tmp"  # leading "_": Spark's file source skips it


def _with_unpacked(batch: Any, packed: np.ndarray, ref_slot: int) -> Any:
    import pyarrow as pa

    batch = batch.append_column(TIME_COL, pa.array(slots_of(packed, ref_slot)))
    return batch.append_column(ACK_COL, pa.array(ack_ids(packed).astype(np.int64)))


def stage_rows(batches: Iterator[Any], *, folder: str, keep: bool,
               grid: TimeGrid) -> Iterator[Any]:
    """In a task: write the partition's rows (without ``lt_track``, or with it unpacked
    when ``keep``) to one file in ``folder``, a new name per attempt; yield one
    row, :data:`STAGED`, with the file and the rows' per-slot receipts."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    tc = TaskContext.get()
    partition = tc.partitionId() if tc else 0
    acc = AckAccumulator()
    ref_slot = reference_slot(grid)
    writer, staged, rows = None, None, 0
    try:
        for batch in batches:
            i = batch.schema.names.index(TRACK_COL)
            packed = np.asarray(batch.column(i).to_numpy(), np.int64)
            acc.add_packed(0, packed, ref_slot, -1)
            rows += len(packed)
            if not batch.num_rows:
                continue
            batch = batch.remove_column(i)
            if keep:
                batch = _with_unpacked(batch, packed, ref_slot)
            if writer is None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                staged = str(Path(folder) / f"{partition:05d}-{uuid.uuid4().hex}.parquet")
                writer = pq.ParquetWriter(staged, batch.schema)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()
    acks = acc.build(grid.window_slots)
    yield pa.RecordBatch.from_pydict({
        "partition": pa.array([partition], pa.int32()),
        "rows": pa.array([rows], pa.int64()),
        "staged": pa.array([staged], pa.string()),
        "times": pa.array([acks.time.tolist()], pa.list_(pa.int64())),
        "xors": pa.array([acks.xor.astype(np.int64).tolist()], pa.list_(pa.int64())),
        "counts": pa.array([acks.count.tolist()], pa.list_(pa.int64())),
    })


class ParquetSink:
    """The ``foreachBatch`` function of ``write_parquet(path)``: the batch's rows in
    ``part-<query>-<batch>-<partition>.parquet`` files, then their receipts acked."""

    def __init__(self, path: str, ref: TrackerRef, segment: str, *,
                 keep_tracking_columns: bool = False, wait_s: float = HOLD_WAIT_S,
                 on_failure: OnFailure | None = None) -> None:
        self.folder = Path(path)
        self.ref = ref
        self.segment = segment
        self.wait_s, self.on_failure = wait_s, on_failure
        self.keep = keep_tracking_columns
        self._lock = threading.Lock()
        self._queries: set[str] = set()  # whose staging folders close() removes
        self._running: set[Path] = set()  # staging folders of batches in a call now

    def __call__(self, df: Any, batch_id: int) -> None:
        query = query_id(df.sparkSession.sparkContext)
        with self._staging(query, batch_id) as stage:
            self._commit(df.mapInArrow(stage, STAGED).collect(), query, batch_id)

    def write_local(self, batch: Any, query: str, batch_id: int) -> None:
        """A batch whose rows the driver holds (an Arrow record batch with ``lt_track``,
        or None: no rows; a driver step's: :mod:`lowtide.spark.operators.
        speculative_driver`), written and acked as a task would, with no Spark job."""
        with self._staging(query, batch_id) as stage:
            staged = next(stage(iter([] if batch is None else [batch])))
            self._commit(staged.to_pylist(), query, batch_id)

    def close(self) -> None:
        """Remove what the stopped queries staged and left (call it once their tasks
        are gone); a batch still in its call removes its own."""
        with self._lock:
            for query in self._queries:
                for folder in (self.folder / TMP).glob(f"{query}-*"):
                    if folder not in self._running:
                        shutil.rmtree(folder, ignore_errors=True)

    @contextlib.contextmanager
    def _staging(self, query: str, batch_id: int) -> Iterator[Any]:
        """The task function of ``query``'s batch ``batch_id``, which stages into a
        folder of that batch's own: emptied first (an earlier attempt's files) and
        removed after."""
        folder = self.folder / TMP / f"{query}-{batch_id}"
        with self._lock:
            self._queries.add(query)
            self._running.add(folder)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            yield functools.partial(stage_rows, folder=str(folder), keep=self.keep,
                                    grid=self.ref.grid)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            with self._lock:
                self._running.discard(folder)

    def _commit(self, tasks: list[Any], query: str, batch_id: int) -> None:
        """Publish the tasks' files (:data:`STAGED` rows) and send their receipts."""
        staged = [(Path(t["staged"]), f"{t['partition']:05d}") for t in tasks if t["staged"]]
        acc = AckAccumulator()
        seg = self.ref.graph.index(self.segment)
        for t in tasks:
            acc.add_reduced(seg, np.array(t["times"], np.int64),
                            as_u64(np.array(t["xors"], np.int64)),
                            np.array(t["counts"], np.int64))
        acks = acc.build(self.ref.grid.window_slots)
        if len(acks):
            self._publish(staged, query, batch_id, digest(acks.time, acks.xor, acks.count))
            send_sink_acks(self.ref, self.segment, query, batch_id, acks,
                           wait_s=self.wait_s, on_failure=self.on_failure)

    def _publish(self, staged: list[tuple[Path, str]], query: str, batch_id: int,
                 rows_digest: str) -> None:
        """The tasks' files under this run's names, unless a re-run of the batch finds
        them committed already with exactly these rows."""
        files = BatchFiles(self.folder, query, batch_id)
        if not files.committed(rows_digest):
            files.publish(staged, rows_digest)


__all__ = ["STAGED", "ParquetSink", "stage_rows"]
