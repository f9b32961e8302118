"""Punctuations built in Spark, for the RR-N comparison (``lowtide bench rr``).

A marker row says "front f has sent every item with seq < bound". Front f emits marker
e (bound ``(e + 1) * g``) after its ``(e + 1) * g``-th item: a row of the same
DataFrame with :data:`MARK_COL` true. At each shuffle a marker is broadcast, one copy
per downstream partition, each copy targeted by a route key (a value that Spark's hash
partitioning sends to that partition); data rows go round robin through the same route
column. A stage partition forwards marker (f, e) once it holds a copy from every
upstream partition that carries it: 1 at the first stage (only front f's source
partition has it), ``p`` at later stages and at the sink.

Why alignment is a count inside one task: marker (f, e) is born in exactly one
micro-batch (the one holding front f's item ``(e + 1) * g - 1``); every stage of a
micro-batch processes all of that batch's rows and forwards aligned markers within the
same task, so every copy, at every stage, lives in the batch the marker was born in.
Copies cannot straddle batches. A task that ends with a partial count (or a copy routed
to another partition) raises :class:`MisalignedMarker` instead of guessing.

Markers follow the data rows of their task, at the front and at every stage (a task's
output is one FIFO channel): a marker never precedes an item it covers; items it does
not cover may precede it, which only delays it within its batch.

>>> import pyarrow as pa
>>> rows = pa.RecordBatch.from_pydict({"front": pa.array([0] * 5, pa.int32()),
...     "seq": pa.array(range(5), pa.int64()), "event_ms": pa.array([0] * 5, pa.int64()),
...     "payload": pa.array([b""] * 5)})
>>> data, markers = inject(rows, 2, Routing((7, 3)), start=0, now_ns=1)
>>> markers.column(EPOCH_COL).to_pylist(), markers.column(ROUTE_COL).to_pylist()
([0, 0, 1, 1], [7, 3, 7, 3])
>>> data.column(ROUTE_COL).to_pylist()
[7, 3, 7, 3, 7]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowtide.spark.sources import UNTRACKED_SCHEMA

MARK_COL = "pu_mark"  # true on marker rows
EPOCH_COL = "pu_epoch"  # marker e of its front (-1 on data rows); seq holds the bound
ROUTE_COL = "pu_route"  # hash key of the partition the row goes to at the next shuffle
EMIT_COL = "pu_emit_ns"  # when this copy left its stage (0 on data rows)
BORN_COL = "pu_born_ns"  # when the front emitted the marker (0 on data rows)
PUNCT_SCHEMA = (
    f"{UNTRACKED_SCHEMA}, {MARK_COL} boolean, {EPOCH_COL} long, {ROUTE_COL} long,"
    f" {EMIT_COL} long, {BORN_COL} long"
)
_EPOCH_BITS = 40  # a marker's id as one int64: front << 40 | epoch


class MisalignedMarker(RuntimeError):
    """A marker copy arrived where it should not, or a marker missed copies."""


@dataclass(frozen=True)
class Routing:
    """``keys[j]`` is a route value that Spark's ``repartition(p, ROUTE_COL)`` sends to
    partition j."""

    keys: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.keys)

    def round_robin(self, n: int, start: int) -> np.ndarray:
        return np.asarray(self.keys, np.int64)[(start + np.arange(n)) % len(self.keys)]


def route_keys(spark: Any, partitions: int) -> Routing:
    """Smallest ids hashed to each partition, asked from Spark itself: ``repartition(p,
    col)`` places a row at ``pmod(hash(col), p)`` (tasks check every copy they get)."""
    rows = spark.range(0, 64 * partitions).selectExpr(
        "id", f"pmod(hash(id), {partitions}) AS j"
    ).collect()
    first: dict[int, int] = {}
    for r in rows:
        first.setdefault(int(r["j"]), int(r["id"]))
    if len(first) < partitions:
        raise RuntimeError(f"no route key found for every one of {partitions} partitions")
    return Routing(tuple(first[j] for j in range(partitions)))


def _with_columns(batch: Any, mark: bool, epoch: Any, route: Any, emit: Any, born: Any) -> Any:
    import pyarrow as pa

    n = batch.num_rows
    cols = {
        MARK_COL: pa.array(np.full(n, mark), pa.bool_()),
        EPOCH_COL: pa.array(np.broadcast_to(np.asarray(epoch, np.int64), (n,)), pa.int64()),
        ROUTE_COL: pa.array(np.broadcast_to(np.asarray(route, np.int64), (n,)), pa.int64()),
        EMIT_COL: pa.array(np.broadcast_to(np.asarray(emit, np.int64), (n,)), pa.int64()),
        BORN_COL: pa.array(np.broadcast_to(np.asarray(born, np.int64), (n,)), pa.int64()),
    }
    for name, col in cols.items():
        i = batch.schema.get_field_index(name)
        batch = batch.append_column(name, col) if i < 0 else batch.set_column(i, name, col)
    return batch


def marker_rows(fronts: Any, epochs: Any, born_ns: Any, g: int, route: Any, emit_ns: int) -> Any:
    """Marker copies as a batch of the punctuated schema."""
    import pyarrow as pa

    n = len(fronts)
    epochs = np.asarray(epochs, np.int64)
    base = pa.RecordBatch.from_arrays(
        [
            pa.array(np.asarray(fronts, np.int32), pa.int32()),
            pa.array((epochs + 1) * g, pa.int64()),  # the bound: items with seq < it
            pa.array(np.zeros(n, np.int64), pa.int64()),
            pa.BinaryArray.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(np.zeros(n + 1, np.int32).tobytes()),
                                 pa.py_buffer(b"")]
            ),
        ],
        names=["front", "seq", "event_ms", "payload"],
    )
    return _with_columns(base, True, epochs, route, emit_ns, born_ns)


def inject(batch: Any, g: int, routing: Routing, start: int, now_ns: int) -> tuple[Any, Any]:
    """The front's stage: its data rows with route keys (round robin from ``start``),
    and one marker per ``g`` items, broadcast to every partition of the first shuffle."""
    seq = np.asarray(batch.column(batch.schema.get_field_index("seq")).to_numpy(), np.int64)
    front = np.asarray(batch.column(batch.schema.get_field_index("front")).to_numpy(), np.int32)
    data = _with_columns(batch, False, -1, routing.round_robin(batch.num_rows, start), 0, 0)
    ends = np.flatnonzero((seq + 1) % g == 0)
    p = routing.partitions
    markers = marker_rows(
        np.repeat(front[ends], p), np.repeat((seq[ends] + 1) // g - 1, p), now_ns, g,
        np.tile(np.asarray(routing.keys, np.int64), len(ends)), now_ns,
    )
    return data, markers


@dataclass
class Aligner:
    """One stage task's markers: copies per marker id, checked on arrival and at the end."""

    expected: int  # copies each marker needs: upstream partitions that carry it
    own_key: int  # the route key of this task's partition
    ids: list[np.ndarray] = field(default_factory=list)
    born: list[np.ndarray] = field(default_factory=list)

    def add(self, markers: Any) -> None:
        if markers.num_rows == 0:
            return
        col = markers.schema.get_field_index
        route = np.asarray(markers.column(col(ROUTE_COL)).to_numpy(), np.int64)
        if bool((route != self.own_key).any()):
            raise MisalignedMarker(f"marker copy for route {route[route != self.own_key][0]}"
                                   f" reached the partition of route {self.own_key}")
        front = np.asarray(markers.column(col("front")).to_numpy(), np.int64)
        epoch = np.asarray(markers.column(col(EPOCH_COL)).to_numpy(), np.int64)
        self.ids.append((front << _EPOCH_BITS) | epoch)
        self.born.append(np.asarray(markers.column(col(BORN_COL)).to_numpy(), np.int64))

    def aligned(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fronts, epochs, born ns) of the markers, each present ``expected`` times."""
        if not self.ids:
            empty = np.empty(0, np.int64)
            return empty, empty, empty
        ids, born = np.concatenate(self.ids), np.concatenate(self.born)
        uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
        if bool((counts != self.expected).any()):
            bad = int(uniq[counts != self.expected][0])
            raise MisalignedMarker(
                f"marker (front {bad >> _EPOCH_BITS}, epoch {bad & ((1 << _EPOCH_BITS) - 1)})"
                f" has {int(counts[counts != self.expected][0])} copies, needs {self.expected}"
            )
        return uniq >> _EPOCH_BITS, uniq & ((1 << _EPOCH_BITS) - 1), born[first]


def stage(
    batches: Iterable[Any], fn: Callable[[Any], Any], aligner: Aligner, g: int,
    routing: Routing, start: int, last: bool,
) -> Iterator[Any]:
    """A pass-through stage with markers: ``fn`` on the data rows (round robin on to the
    next shuffle), then the aligned markers: a copy per next partition, or one copy to
    the sink after the ``last`` stage."""
    import pyarrow.compute as pc

    done = 0
    for batch in batches:
        mark = batch.column(batch.schema.get_field_index(MARK_COL))
        aligner.add(batch.filter(mark))
        data = batch.filter(pc.invert(mark))
        if data.num_rows:
            out = _with_columns(fn(data), False, -1,
                                routing.round_robin(data.num_rows, start + done), 0, 0)
            done += data.num_rows
            yield out
    fronts, epochs, born = aligner.aligned()
    if len(fronts):
        copies = 1 if last else routing.partitions
        keys = np.asarray(routing.keys[:copies], np.int64)
        yield marker_rows(np.repeat(fronts, copies), np.repeat(epochs, copies),
                          np.repeat(born, copies), g, np.tile(keys, len(fronts)), time.time_ns())


def front_task(g: int, routing: Routing, counter: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``mapInArrow`` function of the fronts' stage (one source partition per front);
    ``counter`` (a :class:`PerBatch` accumulator) gets the marker rows it emits."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        start, batch = TaskContext.get().partitionId(), batch_id()
        for rows in batches:
            data, markers = inject(rows, g, routing, start, time.time_ns())
            counter.add({(batch, 0): markers.num_rows})
            yield data
            if markers.num_rows:
                yield markers

    return run


def stage_task(fn: Callable[[Any], Any], g: int, routing: Routing, expected: int, k: int,
               last: bool, counter: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``mapInArrow`` function of pass-through stage ``k`` (after a shuffle on
    :data:`ROUTE_COL`); ``counter`` gets the marker rows it forwards."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        own, batch = TaskContext.get().partitionId(), batch_id()
        aligner = Aligner(expected, routing.keys[own])
        for out in stage(batches, fn, aligner, g, routing, own, last):
            if out.num_rows and out.column(out.schema.get_field_index(MARK_COL))[0].as_py():
                counter.add({(batch, k): out.num_rows})
            yield out

    return run


@dataclass(frozen=True)
class PerBatch:
    """A Spark accumulator parameter: ``{key: value}`` merged by sum (or by max). Keys
    carry the micro-batch id, so a batch interrupted by ``stop()`` can be left out."""

    use_max: bool = False

    def zero(self, value: dict[Any, int]) -> dict[Any, int]:
        return {}

    def addInPlace(self, a: dict[Any, int], b: dict[Any, int]) -> dict[Any, int]:
        for k, v in b.items():
            a[k] = max(a.get(k, v), v) if self.use_max else a.get(k, 0) + v
        return a


def batch_id() -> int:
    """The micro-batch id of the running Spark task."""
    from pyspark import TaskContext

    return int(TaskContext.get().getLocalProperty("streaming.sql.batchId"))


@dataclass(frozen=True)
class Notification:
    """Marker (front, epoch) aligned at the sink."""

    batch: int
    front: int
    epoch: int
    copies: int
    aligned_ns: int  # when the sink counted every copy
    last_copy_ns: int  # when the last copy left the last stage
    born_ns: int  # when the front emitted the marker


class MarkerSink:
    """``foreachBatch`` sink: drops data rows and aligns the markers (``copies`` each,
    one from every partition of the last stage) with one aggregation per batch."""

    def __init__(self, copies: int) -> None:
        self.copies = copies
        self.notifications: list[Notification] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = (
            df.filter(F.col(MARK_COL))
            .groupBy("front", EPOCH_COL)
            .agg(F.count(F.lit(1)), F.max(EMIT_COL), F.min(BORN_COL))
            .collect()
        )
        now = time.time_ns()
        for front, epoch, n, last_ns, born_ns in rows:
            if n != self.copies:
                raise MisalignedMarker(f"marker ({front}, {epoch}) reached the sink with {n}"
                                       f" copies, needs {self.copies}")
            self.notifications.append(
                Notification(batch_id, int(front), int(epoch), int(n), now, int(last_ns),
                             int(born_ns))
            )
