"""Tracked operators: map, flat_map and filter over Arrow batches (``mapInArrow``).

The user function sees the data columns only (the tracking column is split off and
re-attached). Per input batch, one vectorised pass computes:

* receive-acks of the input rows (input segment, count -1),
* the children's ack values ``child_acks(parent, operator id, child index)``, which
  inherit the parent's time (rule 5), and their send-acks (output segment, count +1),

reduced per time by :class:`lowtide.spark.tracking.TimeGroups` (a map groups its rows
by time once for both). Rows carry one tracking column (slot and ack id packed, see
:mod:`lowtide.spark.tracking`); children copy their parent's slot bits. When the
task's input is exhausted (its output is complete) it sends ONE idempotent batch keyed
``(query id, batch id, input segment, partition)`` and waits for the tracker's
confirmation (rules 2 and 6): the batch holds the children and the receipts together,
applied atomically, so children never trail their parent. The last operator before
the null sink then also acks that sink's receipts (:func:`ack_null_sink`).

User functions must be deterministic: Spark re-runs tasks and the acks of a re-run
must equal the first run's.

* ``map``: ``fn(batch) -> batch`` with the same number of rows (row i from input i).
* ``flat_map``: ``fn(batch) -> (batch, parents)`` where ``parents[i]`` is the input
  row of output row i; or ``fn(batch) -> batch`` with an int column ``"_parent"``.
* ``filter``: ``fn(batch) -> boolean mask`` (an Arrow or numpy array).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.core.acks import child_acks
from lowtide.core.messages import AckBatch
from lowtide.spark.sinks import append_trace
from lowtide.spark.source import send_task_batch
from lowtide.spark.tracking import (
    TRACK_COL,
    AckAccumulator,
    TimeGroups,
    ack_ids,
    attach,
    child_index,
    reference_slot,
    with_ids,
)
from lowtide.spark.transport import TrackerRef, task_identity

KINDS = ("map", "flat_map", "filter")
PARENT_COL = "_parent"


def operator_id(name: str) -> int:
    """A stable 63-bit id from the operator's (segment) name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class OpSpec:
    kind: str
    fn: Callable[..., Any]
    name: str
    schema: Any = None  # DDL string or StructType of the output data columns


@dataclass(frozen=True)
class OpRuntime:
    """What a task needs; pickled into the mapInArrow closure."""

    kind: str
    fn: Callable[..., Any]
    ref: TrackerRef
    in_segment: str  # the segment this operator receives from (its name)
    out_segment: str  # the segment its children are sent into
    op_id: int
    # the last operator, its rows going straight into the null sink (see Stream.to_null)
    null_sink: bool = False
    # null sink only: each task appends "<batch> <ack start ns> <confirmed ns> <rows>"
    trace_file: str | None = None


def _split(batch: Any) -> tuple[Any, np.ndarray]:
    """(data-only batch, tracking column int64)."""
    names = batch.schema.names
    i = names.index(TRACK_COL)
    packed = batch.column(i).to_numpy(zero_copy_only=False)
    data = batch.select([j for j in range(len(names)) if j != i])
    return data, np.asarray(packed, np.int64)


def _as_batch(out: Any) -> Any:
    import pyarrow as pa

    if isinstance(out, pa.Table):
        out = out.combine_chunks()
        batches = out.to_batches()
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=out.schema)
        return batches[0]
    if isinstance(out, pa.RecordBatch):
        return out
    raise TypeError(f"tracked operator functions return a pyarrow RecordBatch, got {type(out)}")


def apply_op(rt: OpRuntime, batch: Any, acc: AckAccumulator, in_idx: int, out_idx: int,
             ref_slot: int) -> Any:
    """Run the user function on one Arrow batch; record its acks in ``acc`` (slots
    unwrapped against ``ref_slot``)."""
    data, packed = _split(batch)
    n = len(packed)
    acks = ack_ids(packed)
    groups = TimeGroups.of_packed(packed, ref_slot)
    c_groups = None
    if rt.kind == "map":
        out = _as_batch(rt.fn(data))
        if out.num_rows != n:
            raise ValueError(
                f"map {rt.in_segment!r} returned {out.num_rows} rows for {n}: use flat_map"
            )
        c_groups = groups  # children inherit their parent's time
        c_packed = with_ids(packed, child_acks(acks, rt.op_id, np.zeros(n, np.uint64)))
    elif rt.kind == "filter":
        mask = rt.fn(data)
        mask = np.asarray(
            mask.to_numpy(zero_copy_only=False) if hasattr(mask, "to_numpy") else mask, bool
        )
        if mask.shape != (n,):
            raise ValueError(f"filter {rt.in_segment!r} returned a mask of shape {mask.shape}")
        import pyarrow as pa

        out = data.filter(pa.array(mask, pa.bool_())) if n else data
        c_packed = with_ids(packed[mask],
                            child_acks(acks[mask], rt.op_id, np.zeros(int(mask.sum()), np.uint64)))
    elif rt.kind == "flat_map":
        res = rt.fn(data)
        if isinstance(res, tuple):
            out, parents = _as_batch(res[0]), res[1]
            parents = np.asarray(
                parents.to_numpy(zero_copy_only=False) if hasattr(parents, "to_numpy") else parents,
                np.int64,
            )
        else:
            out = _as_batch(res)
            if PARENT_COL not in out.schema.names:
                raise ValueError(f"flat_map {rt.in_segment!r}: return (batch, parents)")
            i = out.schema.names.index(PARENT_COL)
            parents = np.asarray(out.column(i).to_numpy(zero_copy_only=False), np.int64)
            out = out.select([j for j in range(out.num_columns) if j != i])
        if len(parents) != out.num_rows:
            raise ValueError(f"flat_map {rt.in_segment!r}: one parent index per output row")
        if len(parents) and (parents.min() < 0 or parents.max() >= n):
            raise ValueError(f"flat_map {rt.in_segment!r}: parent index out of range")
        c_packed = with_ids(packed[parents],
                            child_acks(acks[parents], rt.op_id, child_index(parents)))
    else:
        raise ValueError(f"unknown operator kind {rt.kind!r}")
    if c_groups is None:
        c_groups = TimeGroups.of_packed(c_packed, ref_slot)
    acc.add_grouped(out_idx, c_groups, ack_ids(c_packed), +1)
    acc.add_grouped(in_idx, groups, acks, -1)
    return attach(out, c_packed)


def task_function(rt: OpRuntime) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function given to ``DataFrame.mapInArrow``."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        graph = rt.ref.graph
        in_idx, out_idx = graph.index(rt.in_segment), graph.index(rt.out_segment)
        acc = AckAccumulator()
        ref_slot = reference_slot(rt.ref.grid)
        for batch in batches:
            yield apply_op(rt, batch, acc, in_idx, out_idx, ref_slot)
        tc = TaskContext.get()
        partition = tc.partitionId() if tc else 0
        sent = send_task_batch(rt.ref, rt.in_segment, partition, acc)
        if rt.null_sink:
            ack_null_sink(rt, partition, sent, out_idx)

    return run


def ack_null_sink(rt: OpRuntime, partition: int, sent: AckBatch, sink: int) -> None:
    """The null sink's receipts of what this task sent into it: its rows went to Spark's
    ``noop`` writer in this same task, and nothing is committed there. A keyed batch of
    their own, after the operator's (children first), so the operator's batch is the
    same whatever sink follows it, and the sink's rows are counted in the status."""
    mine = sent.segment == sink
    acc = AckAccumulator()
    acc.add_reduced(sink, sent.time[mine], sent.xor[mine], -sent.count[mine])
    acc.rows_received = int(sent.count[mine].sum())
    started_ns = time.time_ns()
    send_task_batch(rt.ref, f"<null>{rt.out_segment}", partition, acc)
    if rt.trace_file and acc.rows_received:
        append_trace(rt.trace_file, task_identity().batch_id, started_ns, acc.rows_received)
