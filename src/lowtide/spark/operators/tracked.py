"""Tracked operators: map, flat_map and filter over Arrow batches (``mapInArrow``).

The user function sees the data columns only (the tracking column is split off and
re-attached). Per input batch, one vectorised pass computes:

* receive-acks of the input rows (input segment, count -1),
* the children's 32-bit ack ids ``child_ids(parent id, operator salt, child index)``,
  which inherit the parent's time (rule 5), and their send-acks (output segment,
  count +1),

reduced per time by :func:`lowtide.spark.tracking.track_children` (it groups the rows
by time once for both). Rows carry one tracking column (slot and ack id packed, see
:mod:`lowtide.spark.tracking`); children copy their parent's slot bits. Once the
task has processed its last input batch (every ack is known) it submits ONE
idempotent batch keyed ``(query id, batch id, input segment, partition)``, emits the
outputs it held back (up to :data:`HOLD_OUTPUT_BYTES`) while the batch travels, and
waits for the tracker's confirmation before it ends (rules 2 and 6): the batch holds
the children and the receipts together, applied atomically, so children never trail
their parent. The last operator before the null sink then also acks that sink's
receipts (:func:`ack_null_sink`).

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
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from lowtide.core.messages import AckBatch
from lowtide.spark.operators.frames import TRACKED_FRAME_KINDS, frame_acks
from lowtide.spark.sinks import append_trace
from lowtide.spark.sources.log_source import TaskBatch, submit_task_batch
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    attach,
    operator_salt,
    reference_slot,
    track_children,
)
from lowtide.spark.tracking.key_ranges import by_range
from lowtide.spark.tracking.transport import TrackerRef, task_identity

KINDS = ("map", "flat_map", "filter")
# a task holds back up to this much of its output until its batch is submitted
HOLD_OUTPUT_BYTES = 16 << 20
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

    def segments(self) -> list[str]:
        return [self.name]


@dataclass(frozen=True)
class OpRuntime:
    """What a task needs; pickled into the mapInArrow closure."""

    kind: str  # one of KINDS, a tracked DataFrame step's ("where", ...) or "entry"
    fn: Callable[..., Any] | None
    ref: TrackerRef
    in_segment: str  # the segment this operator receives from (its name)
    out_segment: str  # the segment its children are sent into
    op_id: int
    # the last operator, its rows going straight into the null sink (see Stream.to_null)
    null_sink: bool = False
    # null sink only: each task appends "<batch> <ack start ns> <confirmed ns> <rows>"
    trace_file: str | None = None
    # outputs a task holds back until its batch is submitted (see hold_back)
    hold_output_bytes: int = HOLD_OUTPUT_BYTES

    @cached_property
    def salt(self) -> int:
        return operator_salt(self.op_id)


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
    if rt.kind in TRACKED_FRAME_KINDS:  # the JVM did the work; only the acks are left
        return frame_acks(rt.kind, batch, acc, (in_idx, out_idx), ref_slot, rt.salt)
    if rt.kind == "entry":  # a labelled stream's entry: fn is its read_stream.Labels
        assert rt.fn is not None
        return rt.fn(batch, acc, in_idx, out_idx, ref_slot)
    data, packed = _split(batch)
    out, children = _run_fn(rt, data, len(packed))
    c_packed = track_children(acc, (in_idx, out_idx), packed, ref_slot, rt.salt, children)
    return attach(out, c_packed)


def _run_fn(rt: OpRuntime, data: Any, n: int) -> tuple[Any, np.ndarray | None]:
    """(output batch, children) of the user function on ``n`` rows: children as
    :func:`lowtide.spark.tracking.track_children` takes them."""
    if rt.kind == "map":
        out = _as_batch(rt.fn(data))
        if out.num_rows != n:
            raise ValueError(
                f"map {rt.in_segment!r} returned {out.num_rows} rows for {n}: use flat_map"
            )
        return out, None
    if rt.kind == "filter":
        import pyarrow as pa

        mask = _numpy(rt.fn(data), bool)
        if mask.shape != (n,):
            raise ValueError(f"filter {rt.in_segment!r} returned a mask of shape {mask.shape}")
        return (data.filter(pa.array(mask, pa.bool_())) if n else data), mask
    if rt.kind != "flat_map":
        raise ValueError(f"unknown operator kind {rt.kind!r}")
    res = rt.fn(data)
    if isinstance(res, tuple):
        out, parents = _as_batch(res[0]), _numpy(res[1], np.int64)
    else:
        out = _as_batch(res)
        if PARENT_COL not in out.schema.names:
            raise ValueError(f"flat_map {rt.in_segment!r}: return (batch, parents)")
        i = out.schema.names.index(PARENT_COL)
        parents = _numpy(out.column(i), np.int64)
        out = out.select([j for j in range(out.num_columns) if j != i])
    if len(parents) != out.num_rows:
        raise ValueError(f"flat_map {rt.in_segment!r}: one parent index per output row")
    if len(parents) and (parents.min() < 0 or parents.max() >= n):
        raise ValueError(f"flat_map {rt.in_segment!r}: parent index out of range")
    return out, parents


def _numpy(values: Any, dtype: Any) -> np.ndarray:
    """An Arrow or array-like column as a numpy array of ``dtype``."""
    if hasattr(values, "to_numpy"):
        values = values.to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype)


def task_function(*chain: OpRuntime) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function given to ``DataFrame.mapInArrow``: the tracked steps of ``chain``
    one after the other on each Arrow batch (steps with no shuffle or JVM work between
    them share a task: the rows cross to Python once). Their acks go into ONE batch,
    keyed by the first step's input segment: applied atomically, a step's children and
    the next step's receipts of them cancel in the tracker at once (rule 2).

    It holds back its latest outputs (up to ``hold_output_bytes``): once the input is
    exhausted every ack is known, so the task's batch goes to the tracker while the
    held outputs are emitted, and the task waits for the confirmation only at its end
    (rule 6)."""
    first, last = chain[0], chain[-1]

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        graph = first.ref.graph
        idx = [(graph.index(rt.in_segment), graph.index(rt.out_segment)) for rt in chain]
        acc = AckAccumulator()
        ref_slot = reference_slot(first.ref.grid)
        sent: list[Waiter] = []

        def apply_chain(batch: Any) -> Any:
            for rt, (in_idx, out_idx) in zip(chain, idx, strict=True):
                # in a segment split into key ranges, each range's rows apart (rule 15)
                batch = by_range(graph, in_idx, out_idx, batch, lambda b, i, o, rt=rt:
                                 apply_op(rt, b, acc, i, o, ref_slot))
            return batch

        outputs = (apply_chain(batch) for batch in batches)
        yield from hold_back(outputs, first.hold_output_bytes,
                             lambda: sent.extend(submit_acks(first, last, acc, idx[-1][1])))
        for b in sent:
            b.wait()

    return run


def hold_back(outputs: Iterable[Any], cap_bytes: int,
              before_held: Callable[[], None]) -> Iterator[Any]:
    """Yield ``outputs`` (Arrow batches) holding back the latest, up to ``cap_bytes``
    (always at least one); once ``outputs`` is exhausted call ``before_held``, then
    yield the held ones. The confirmation's round trip then overlaps Spark's work on
    all of them, not on one batch: measured 4-7 points of throughput on 16-byte rows
    (BENCHMARKS.md, 2026-11-24)."""
    held: deque[Any] = deque()
    held_bytes = 0
    for out in outputs:
        held.append(out)
        held_bytes += out.nbytes
        while held_bytes > cap_bytes and len(held) > 1:
            first = held.popleft()
            held_bytes -= first.nbytes
            yield first
    before_held()
    yield from held


def submit_acks(first: OpRuntime, last: OpRuntime, acc: AckAccumulator,
                out_idx: int) -> list[Waiter]:
    """Submit the task's batch (children and receipts together, applied atomically, so
    children never trail their parent: rule 2), keyed by the first step's input
    segment, and, when the last step feeds the null sink, the sink's receipts after
    it."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    partition = tc.partitionId() if tc else 0
    sent = submit_task_batch(first.ref, first.in_segment, partition, acc)
    if not last.null_sink:
        return [sent]
    return [sent, ack_null_sink(last, partition, sent.acks, out_idx)]


def ack_null_sink(rt: OpRuntime, partition: int, sent: AckBatch, sink: int) -> Waiter:
    """The null sink's receipts of what this task sent into it: its rows go to Spark's
    ``noop`` writer in this same task, and nothing is committed there. A keyed batch of
    their own, submitted after the operator's (children first), so the operator's
    batch is the same whatever sink follows it, and the sink's rows are counted in the
    status."""
    mine = sent.segment == sink
    acc = AckAccumulator()
    acc.add_reduced(sink, sent.time[mine], sent.xor[mine], -sent.count[mine])
    started_ns = time.time_ns()
    receipts = submit_task_batch(rt.ref, f"<null>{rt.out_segment}", partition, acc)
    if rt.trace_file and acc.rows_received:
        return _Traced(receipts, rt.trace_file, started_ns, acc.rows_received)
    return receipts


class Waiter(Protocol):
    def wait(self) -> None: ...


@dataclass(frozen=True)
class _Traced:
    """Receipts whose confirmation goes into the sink's trace (benchmarks)."""

    receipts: TaskBatch
    path: str
    started_ns: int
    rows: int

    def wait(self) -> None:
        self.receipts.wait()
        append_trace(self.path, task_identity().batch_id, self.started_ns, self.rows)
