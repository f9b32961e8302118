"""The lazy description of a tracked stream: its steps, and the segment graph they make.

Segment k holds the rows sent by tracked operator k-1 (or the source) and not yet
received by tracked operator k (or the sink); it is named after its receiver.
Untracked Spark operators (``.transform(fn)``, ``.repartition(n)``) may stand between
tracked ones only if they keep rows 1:1: a row they drop shows up as a stuck window
with missing items in the segment it was sent into, a row they duplicate as extra
items, both with segment, window and count (:meth:`TrackedQuery.stuck`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lowtide.core.graph import SegmentGraph
from lowtide.spark.operators.tracked import OpSpec
from lowtide.spark.operators.windows import WindowSpec, make_windowed
from lowtide.spark.sinks import console_writer
from lowtide.spark.sources.generator import GeneratorSpec

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline
    from lowtide.spark.pipeline.query import TrackedQuery


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "log" | "gen"
    name: str | None  # ingest segment name (log) or None (the generator is the front)
    options: dict[str, str]
    spec: GeneratorSpec | None = None


@dataclass(frozen=True)
class TransformSpec:
    fn: Callable[[Any], Any]


Step = OpSpec | WindowSpec | TransformSpec


@dataclass(frozen=True)
class Stream:
    """An immutable, lazy description of a tracked stream; methods read like PySpark."""

    pipeline: Pipeline
    steps: tuple[Step, ...] = ()

    def _then(self, step: Step) -> Stream:
        return replace(self, steps=(*self.steps, step))

    def _default_name(self, kind: str) -> str:
        k = sum(isinstance(s, OpSpec | WindowSpec) for s in self.steps) + 1
        return f"{kind}{k}"

    # tracked operators
    def map(
        self, fn: Callable[[Any], Any], schema: Any = None, *, name: str | None = None
    ) -> Stream:
        """Tracked 1:1 map over Arrow batches: ``fn(RecordBatch) -> RecordBatch``."""
        return self._then(OpSpec("map", fn, name or self._default_name("map"), schema))

    def flat_map(self, fn: Callable[[Any], Any], schema: Any, *, name: str | None = None) -> Stream:
        """Tracked 1:N: ``fn(batch) -> (batch, parents)``; see :mod:`.operators`."""
        return self._then(OpSpec("flat_map", fn, name or self._default_name("flat_map"), schema))

    def filter(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """Tracked filter: ``fn(batch) -> boolean mask``."""
        return self._then(OpSpec("filter", fn, name or self._default_name("filter"), None))

    def window(self, size: str | int, *, key: str, slide: str | int | None = None,
               name: str | None = None, poll_ms: int = 100) -> Any:
        """Exact keyed windows over global time (tumbling, or sliding with ``slide``);
        finish with ``.agg(n="count", total=("amount", "sum"))`` or ``.apply(fn,
        schema)``. See :mod:`lowtide.spark.operators.windows`."""
        return make_windowed(self, size, key, slide, name or self._default_name("window"),
                             poll_ms, self.pipeline.grid.delta_ms)

    # untracked, row-preserving
    def transform(self, fn: Callable[[Any], Any]) -> Stream:
        """Apply an untracked DataFrame -> DataFrame function. It must keep rows 1:1
        (and the tracking columns as they are), or the tracker reports the
        difference as missing or extra items."""
        return self._then(TransformSpec(fn))

    def ends_in_operator(self) -> bool:
        """Is the last step a tracked operator (whose rows reach the sink unchanged)?"""
        return bool(self.steps) and isinstance(self.steps[-1], OpSpec)

    def repartition(self, n: int) -> Stream:
        return self.transform(lambda df: df.repartition(n))

    # sinks (each starts the query)
    def foreach_batch(
        self,
        fn: Callable[[Any, int], Any],
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """``fn(df, batch_id)`` commits the batch; receipt is acked after it returns."""
        return self.pipeline._start(
            self, ("foreach", fn, keep_tracking_columns, None), name, checkpoint, trigger,
            query_name,
        )

    def to_console(
        self, *, checkpoint: str, name: str = "sink", num_rows: int = 20, trigger: str | None = None
    ) -> TrackedQuery:
        return self.foreach_batch(
            console_writer(num_rows), checkpoint=checkpoint, name=name, trigger=trigger
        )

    def write_parquet(
        self,
        path: str,
        *,
        checkpoint: str,
        name: str = "sink",
        keep_tracking_columns: bool = False,
        trigger: str | None = None,
        query_name: str | None = None,
    ) -> TrackedQuery:
        """Parquet files ``part-<batch>-<partition>.parquet`` under ``path``, published
        by the driver-side commit; acked after publication."""
        options = {"mode": "parquet", "path": path,
                   "keepTrackingColumns": str(keep_tracking_columns).lower()}
        return self.pipeline._start(
            self, ("writer", options), name, checkpoint, trigger, query_name
        )

    def to_null(
        self, *, checkpoint: str, name: str = "sink", trigger: str | None = None,
        query_name: str | None = None, trace_file: str | None = None,
    ) -> TrackedQuery:
        """Drop the rows. Ending in a tracked operator, the query writes to Spark's
        ``noop`` sink and each task of the operator acks its rows as received by the
        sink right after its own batch (it hands them to the sink in the same task, and
        nothing is committed), so the sink costs nothing; otherwise a ``foreachBatch``
        acks the rows from one aggregation job per batch in the JVM (no Python pass),
        after the rows' untracked steps ran.
        ``trace_file``: whoever acks the sink appends ``<batch> <ack start ns> <acks
        confirmed ns> <rows>`` (the operator's tasks: one line per task attempt)."""
        return self.pipeline._start(
            self, ("foreach", None, False, trace_file), name, checkpoint, trigger, query_name
        )

    # introspection
    def segment_names(self, sink: str = "sink") -> list[str]:
        src = self.pipeline._source
        names = [src.name] if src is not None and src.name else []
        for s in self.steps:
            if isinstance(s, OpSpec):
                names.append(s.name)
            elif isinstance(s, WindowSpec):  # inbound, then state (holds, rule 7)
                names += s.segments()
        return [*names, sink]

    def graph(self, sink: str = "sink") -> SegmentGraph:
        names = self.segment_names(sink)
        return SegmentGraph.of(*[(n, (names[i - 1],) if i else ()) for i, n in enumerate(names)])
