"""Any Spark source as a tracked entry: rows that carry ``lt_time`` and ``lt_ack``.

A producer's front (``lowtide.Front``, a Kafka or file producer helper, or a tracked
table sink upstream) labels every record with ``lt_time`` (its slot) and ``lt_ack``
(its 64-bit root ack viewed as int64) and sends the matching acks into the ingest
segment before the record is written. Whatever Spark source then reads the records
(Kafka, files, a Delta table), its entry (:class:`EntrySpec`) is the first step of one
``mapInArrow`` right on top of it, together with the tracked Arrow steps that follow
it directly (the rows cross to Python once); each task

* receives its rows out of the ingest segment (XOR of ``lt_ack`` per ``lt_time``,
  count -1) and sends them into the next segment with their 32-bit ids (the low bits
  of ``lt_ack``, packed into ``lt_track`` as the log source does),
* drops the two label columns (and ``lt_front``) for ``lt_track``, so every tracked
  step and exact window downstream works as on lowtide's own sources,
* submits ONE idempotent batch keyed ``(query id, batch id, ingest segment,
  partition)`` once its acks are known (with those of the steps chained after it),
  and waits for the confirmation before it ends (rule 6).

Exactly once per row: Spark logs each micro-batch's offsets (Kafka offsets, the files
of the batch, a Delta version) in the checkpoint before it runs, so a retried task or a
batch re-run after a restart reads the same rows into the same partition and sends the
same key, which the tracker applies once. (A batch whose partitioning changes between
runs, e.g. a different ``maxPartitionBytes`` or Kafka ``minPartitions`` before a
restart, is not the same key: its rows show up as extra and missing items in the
ingest segment, never as a silent advance.)

A query attached to a topic whose producers run (``joins_dir=``, rule 16): the query
asks its fronts to feed it (:func:`lowtide.spark.sources.joins.request_join`, when it
starts) and each running front answers once with its join time ``T_f``; the entry keeps
only the rows of front ``f`` (column ``lt_front``) labelled at or after ``T_f``, and
none of a front that has not answered yet (they all lie below its future ``T_f``: the
answer is written before the front labels anything at or above it). Rows without
``lt_front`` (older producers) and of fronts that never answered anything are kept.
The answers are written once, so a retried task keeps the same rows: exactly those
whose acks the front sent into the query's segment (rule 5).

A task reads the joins directory once, at its first batch of rows, and keeps the
answers for the rest (one scan per task, not per Arrow batch and front). That is
enough: the batch's rows were in the topic before Spark planned it, and an answer is
written before its front labels any row at or above it, so every answer that changes
what the batch keeps was there when the task looked. An answer written later (after
the batch was planned) only concerns rows of later batches, which read again: it is
never applied to part of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowtide.core.errors import LowtideError
from lowtide.spark.sources.joins import Answers, read_answers, request_join
from lowtide.spark.sources.labels import FRONT_COLUMN
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    ack_ids,
    as_u64,
    attach,
    pack,
)

#: Spark types a label column may have (read as int64)
LABEL_TYPES = ("bigint", "int")


class NotLabelled(LowtideError, ValueError):
    """The DataFrame cannot be a tracked entry as it is (not streaming, no labels)."""


def check_labelled(df: Any, time_col: str, ack_col: str, joins: bool = False) -> None:
    """One-line errors, raised where the pipeline is described, for a DataFrame that
    is not streaming or lacks integer label columns (``joins``: and ``lt_front``)."""
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
    if joins and types.get(FRONT_COLUMN) not in LABEL_TYPES:
        raise NotLabelled(f"joins_dir= needs the front of each record as a bigint column "
                          f"{FRONT_COLUMN!r} (Kafka: KAFKA_HEADER_EXPRS reads its header)")
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


@dataclass(frozen=True)
class EntrySpec:
    """The entry of a labelled stream: the first tracked Arrow step of its plan, so the
    tracked steps after it share its task (the rows cross to Python once)."""

    name: str  # the ingest segment: the one its fronts feed
    time_col: str
    ack_col: str
    joins_dir: str | None = None  # shared with the fronts: keep each from its join

    def labels(self) -> Labels:
        return Labels(self.time_col, self.ack_col, self.name, self.joins_dir)


@dataclass(frozen=True)
class Labels:
    """What the entry does to one Arrow batch, as a tracked task's step (the ``fn`` of
    its ``OpRuntime``): receive its rows out of the ingest segment, send them into the
    next one, and swap the labels for ``lt_track``."""

    time_col: str
    ack_col: str
    segment: str = ""
    joins_dir: str | None = None
    #: the join answers, read at the task's first batch (each task has its own copy)
    _answers: list[Answers] = field(default_factory=list, compare=False, repr=False)

    def __call__(self, batch: Any, acc: AckAccumulator, in_idx: int, out_idx: int,
                 ref_slot: int) -> Any:
        if self.joins_dir is not None:
            batch = self._joined_rows(batch, self.joins_dir)
        times, acks = _labels(batch, self.time_col, self.ack_col)
        packed = pack(times, acks, ref_slot)
        acc.add(out_idx, times, ack_ids(packed), +1)  # children first (rule 2)
        acc.add(in_idx, times, acks, -1)
        keep = [i for i, n in enumerate(batch.schema.names)
                if n not in (self.time_col, self.ack_col, FRONT_COLUMN)]
        return attach(batch.select(keep), packed)

    def _joined_rows(self, batch: Any, joins_dir: str) -> Any:
        """The rows of ``batch`` whose fronts sent them into this segment: per front,
        those labelled at or after its answer's time (none before it answered)."""
        import pyarrow as pa

        fronts = batch.column(batch.schema.names.index(FRONT_COLUMN))
        times = batch.column(batch.schema.names.index(self.time_col))
        keep = np.asarray(fronts.is_null().to_numpy(zero_copy_only=False)).copy()
        ids = np.asarray(fronts.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        t = np.asarray(times.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        if not self._answers:
            self._answers.append(read_answers(joins_dir))
        for front in np.unique(ids[~keep]).tolist():
            start = self._answers[0].start_time(self.segment, front)
            if start is not None:
                keep |= (ids == front) & (t >= start)
        return batch if keep.all() else batch.filter(pa.array(keep))


def entry_of(segment: str, options: dict[str, str]) -> EntrySpec:
    """The entry of a ``read_stream`` source, when its query is built; with a joins
    directory, the query asks the producers' running fronts to feed it first."""
    joins_dir = options.get("joins_dir")
    if joins_dir is not None:
        request_join(joins_dir, segment, consumer=segment)
    return EntrySpec(segment, options["time_col"], options["ack_col"], joins_dir)


def entry_schema(df: Any, time_col: str, ack_col: str) -> Any:
    """The entry's output schema: the data columns, then ``lt_track``."""
    from pyspark.sql.types import LongType, StructField, StructType

    kept = [f for f in df.schema.fields if f.name not in (time_col, ack_col, FRONT_COLUMN)]
    return StructType([*kept, StructField(TRACK_COL, LongType(), False)])


__all__ = [
    "LABEL_TYPES",
    "EntrySpec",
    "Labels",
    "NotLabelled",
    "check_labelled",
    "entry_of",
    "entry_schema",
]
