"""Any Spark source as a tracked entry: rows that carry ``lt_time`` and ``lt_ack``.

A producer's front (``lowtide.Front``, a Kafka or file producer helper, or a tracked
table sink upstream) labels every record with ``lt_time`` (its slot) and ``lt_ack``
(its 64-bit root ack viewed as int64) and sends the matching acks into the ingest
segment before the record is written. Whatever Spark source then reads the records
(Kafka, files, a Delta table), :func:`read_labelled` puts one ``mapInArrow`` right on
top of it: each task

* receives its rows out of the ingest segment (XOR of ``lt_ack`` per ``lt_time``,
  count -1) and sends them into the next segment with their 32-bit ids (the low bits
  of ``lt_ack``, packed into ``lt_track`` as the log source does),
* drops the two label columns for ``lt_track``, so every tracked step and exact
  window downstream works as on lowtide's own sources,
* submits ONE idempotent batch keyed ``(query id, batch id, ingest segment,
  partition)`` once its acks are known, and waits for the confirmation before it ends
  (rule 6).

Exactly once per row: Spark logs each micro-batch's offsets (Kafka offsets, the files
of the batch, a Delta version) in the checkpoint before it runs, so a retried task or a
batch re-run after a restart reads the same rows into the same partition and sends the
same key, which the tracker applies once. (A batch whose partitioning changes between
runs, e.g. a different ``maxPartitionBytes`` or Kafka ``minPartitions`` before a
restart, is not the same key: its rows show up as extra and missing items in the
ingest segment, never as a silent advance.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lowtide.spark.operators.tracked import HOLD_OUTPUT_BYTES, hold_back
from lowtide.spark.sources.log_source import TaskBatch, submit_task_batch
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    as_u64,
    attach,
    pack,
    reference_slot,
)
from lowtide.spark.tracking.transport import TrackerRef

#: Spark types a label column may have (read as int64)
LABEL_TYPES = ("bigint", "int")


class NotLabelled(ValueError):
    """The DataFrame cannot be a tracked entry as it is (not streaming, no labels)."""


def check_labelled(df: Any, time_col: str, ack_col: str) -> None:
    """One-line errors, raised where the pipeline is described, for a DataFrame that
    is not streaming or lacks integer label columns."""
    if not getattr(df, "isStreaming", False):
        raise NotLabelled("read_stream takes a streaming DataFrame (spark.readStream...); "
                          "for a batch DataFrame recompute without lowtide")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    for col in (time_col, ack_col):
        if col not in types:
            raise NotLabelled(
                f"the stream has no column {col!r} (it has {', '.join(types)}): label the "
                f"records with a lowtide front, or pass time=/ack= naming the label columns")
        if types[col] not in LABEL_TYPES:
            raise NotLabelled(f"label column {col!r} is {types[col]}, not bigint: cast it "
                              "(e.g. from a Kafka header) before read_stream")
    if TRACK_COL in types:
        raise NotLabelled(f"the stream already has {TRACK_COL!r}: it is tracked already")


def _labels(batch: Any, time_col: str, ack_col: str) -> tuple[np.ndarray, np.ndarray]:
    """(times int64, root acks uint64) of an Arrow batch; nulls are refused."""
    cols = [batch.column(batch.schema.names.index(c)) for c in (time_col, ack_col)]
    for name, col in zip((time_col, ack_col), cols, strict=True):
        if col.null_count:
            raise ValueError(f"{col.null_count} rows have no {name!r}: every record of a "
                             "tracked entry must be labelled by a front")
    times = np.asarray(cols[0].to_numpy(zero_copy_only=False), np.int64)
    acks = as_u64(np.asarray(cols[1].to_numpy(zero_copy_only=False), np.int64))
    return times, acks


def entry_function(ref: TrackerRef, ingest: str, out: str, time_col: str,
                   ack_col: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of the entry; see the module docstring."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        graph = ref.graph
        out_idx, ingest_idx = graph.index(out), graph.index(ingest)
        ref_slot = reference_slot(ref.grid)
        acc = AckAccumulator()
        sent: list[TaskBatch] = []

        def label(batch: Any) -> Any:
            times, acks = _labels(batch, time_col, ack_col)
            packed = pack(times, acks, ref_slot)
            acc.add(out_idx, times, ack_ids(packed), +1)  # children first (rule 2)
            acc.add(ingest_idx, times, acks, -1)
            keep = [i for i, n in enumerate(batch.schema.names) if n not in (time_col, ack_col)]
            return attach(batch.select(keep), packed)

        def submit() -> None:
            tc = TaskContext.get()
            sent.append(submit_task_batch(ref, ingest, tc.partitionId() if tc else 0, acc))

        # as a tracked operator does: the batch travels while the held outputs go out
        yield from hold_back((label(b) for b in batches), HOLD_OUTPUT_BYTES, submit)
        for b in sent:
            b.wait()

    return run


def entry_schema(df: Any, time_col: str, ack_col: str) -> Any:
    """The entry's output schema: the data columns, then ``lt_track``."""
    from pyspark.sql.types import LongType, StructField, StructType

    kept = [f for f in df.schema.fields if f.name not in (time_col, ack_col)]
    return StructType([*kept, StructField(TRACK_COL, LongType(), False)])


def read_labelled(df: Any, ref: TrackerRef, ingest: str, out: str, time_col: str,
                  ack_col: str) -> Any:
    """``df`` (a labelled streaming DataFrame) as a tracked stream sending into ``out``."""
    fn = entry_function(ref, ingest, out, time_col, ack_col)
    return df.mapInArrow(fn, entry_schema(df, time_col, ack_col))


__all__ = [
    "LABEL_TYPES",
    "NotLabelled",
    "check_labelled",
    "entry_function",
    "entry_schema",
    "read_labelled",
]
