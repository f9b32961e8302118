"""The lazy description of a tracked stream: its steps, and the segment graph they make.

A stream is a source (or a union of streams) followed by a chain of steps
(``Stream.steps``); each step names the segments it receives from (``segments()``:
none for an untracked step). Streams share their prefixes, so the description is a
DAG: several sources, unions (``a.union(b)``), fan-out (two streams built on one);
:mod:`lowtide.spark.pipeline.dag` derives the segment graph from it.

A segment holds the rows sent by its senders (tracked steps or sources) and not yet
received by its receiver (a tracked step or the sink); it is named after its receiver.
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
from lowtide.spark.operators.dedup import DedupSpec
from lowtide.spark.operators.fold import FoldLogic, time_mode_of
from lowtide.spark.operators.frames import FrameSpec, enrich_spec
from lowtide.spark.operators.joins import JoinSpec, check_join
from lowtide.spark.operators.keyed_state import StatefulSpec
from lowtide.spark.operators.retry import RetryPolicy, RetrySpec
from lowtide.spark.operators.running import GroupedSpec, make_grouped
from lowtide.spark.operators.sessions import SessionSpec, make_sessions
from lowtide.spark.operators.slot_logic import KeptRows
from lowtide.spark.operators.speculative import SpeculativeSpec, make_speculative
from lowtide.spark.operators.speculative_apply import SpeculativeApplySpec, make_speculative_apply
from lowtide.spark.operators.speculative_fold import (
    is_fold,
    make_speculative_fold,
    writes_changelog,
)
from lowtide.spark.operators.speculative_join import make_speculative_join
from lowtide.spark.operators.speculative_running import make_speculative_grouped
from lowtide.spark.operators.speculative_sessions import make_speculative_sessions
from lowtide.spark.operators.tracked import OpSpec
from lowtide.spark.operators.windows import WindowSpec, make_windowed
from lowtide.spark.pipeline.dag import PipelineShapeError, SegmentPlan, derive
from lowtide.spark.pipeline.describe import (
    Aggregated,
    Keys,
    Windowed,
    described,
    duration_of,
    names_of,
    with_keys,
)
from lowtide.spark.pipeline.sources import SourceSpec
from lowtide.spark.pipeline.stream_sinks import StreamSinks
from lowtide.spark.tracking.column import TRACK_COL

if TYPE_CHECKING:
    from lowtide.spark.pipeline.builder import Pipeline


@dataclass(frozen=True)
class TransformSpec:
    """An untracked ``DataFrame -> DataFrame`` step (it must keep rows 1:1)."""

    fn: Callable[[Any], Any]
    name: str

    def segments(self) -> list[str]:
        return []


Step = (OpSpec | WindowSpec | StatefulSpec | JoinSpec | TransformSpec | FrameSpec | DedupSpec
        | SessionSpec | GroupedSpec | SpeculativeSpec | SpeculativeApplySpec | RetrySpec)


@dataclass(frozen=True)
class Stream(StreamSinks):
    """An immutable, lazy description of a tracked stream; methods read like PySpark."""

    pipeline: Pipeline
    steps: tuple[Step, ...] = ()
    #: where the rows come from: a source, or the union of ``inputs`` (a join: its two
    #: sides, and the join is the first step)
    source: SourceSpec | None = None
    inputs: tuple[Stream, ...] = ()

    def _then(self, step: Step) -> Stream:
        return replace(self, steps=(*self.steps, step))

    def _depth(self) -> int:
        """Steps on the longest path from a source to the end of this stream."""
        return len(self.steps) + max((s._depth() for s in self.inputs), default=0)

    def _default_name(self, kind: str) -> str:
        return f"{kind}{self._depth() + 1}"

    def union(self, *others: Stream) -> Stream:
        """The rows of this stream and of ``others`` (same columns, by name, like
        ``DataFrame.unionByName``): the next tracked receiver's segment has all of
        their last senders as senders."""
        if not others:
            raise PipelineShapeError("union() needs at least one other stream")
        if any(o.pipeline is not self.pipeline for o in others):
            raise PipelineShapeError("union() of streams of different Pipelines")
        return Stream(self.pipeline, inputs=(self, *others))

    def join(self, other: Stream | Any, on: Keys | Any = None, how: str = "inner", *,
             left_on: Keys | None = None, right_on: Keys | None = None,
             within: str | int | None = None, lower: str | int | None = None,
             upper: str | int | None = None, window: str | int | None = None,
             name: str | None = None, poll_ms: int = 100) -> Stream:
        """Exact join over global time of rows of this stream and ``other`` with equal
        keys: ``on`` (names on both sides, or a Column condition of equalities joined
        by ``&``) or ``left_on``/``right_on``. An interval join matches a left row at
        time ``a`` and a right row at ``b`` when ``lower <= b - a <= upper``
        (``within=w``: ``lower=-w, upper=w``); a window join (``window=``) when both
        are in the same tumbling window. ``how``: "inner", "left", "right", "full",
        "semi", "anti" (or Spark's names, "left_outer", ...). Results are emitted when
        both inputs are complete for them, outer rows with nulls when the other side
        is. See :mod:`lowtide.spark.operators.joins`. ``other`` a static DataFrame:
        see :meth:`join_static`."""
        timed = any(v is not None for v in (within, lower, upper, window))
        if not isinstance(other, Stream):
            return self.join_static(other, on, how=how, name=name, timed=timed)
        if other.pipeline is not self.pipeline:
            raise PipelineShapeError("join() of streams of different Pipelines")
        name = name or self._default_name("join")
        how, lower_ms, upper_ms = check_join(
            name, how, self.pipeline.grid.delta_ms,
            **{f"{k}_ms": duration_of(v, f"join {name!r}: {k}=") for k, v in (
                ("within", within), ("lower", lower), ("upper", upper), ("window", window))
               if v is not None})
        spec = JoinSpec(name, (), lower_ms, upper_ms, how, poll_ms, duration_of(window))
        return Stream(self.pipeline, steps=(with_keys(spec, on, left_on, right_on),),
                      inputs=(self, other))

    def join_static(self, other: Any, on: str | list[str] | tuple[str, ...], *,
                    how: str = "inner", name: str | None = None,
                    timed: bool = False) -> Stream:
        """Tracked stream-static join (enrichment), what ``join(static_df, on, how)``
        calls: like ``DataFrame.join(other, on, how)`` row for row, ``how`` "inner" or
        "left"; a row matching k static rows has k children, an unmatched one none
        (inner) or one with nulls (left). See :mod:`lowtide.spark.operators.frames`."""
        name = name or self._default_name("join")
        if isinstance(other, Stream):
            raise PipelineShapeError(f"step {name!r}: a stream-stream join needs within= "
                                     "or window=: use join()")
        if timed:
            raise PipelineShapeError(f"step {name!r}: within= and window= are for "
                                     "stream-stream joins; the other side is a static "
                                     "DataFrame")
        return self._then(enrich_spec(name, other, names_of(on, f"step {name!r}: join"), how))

    # tracked operators
    def map(
        self, fn: Callable[[Any], Any], schema: Any = None, *, name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Stream:
        """Tracked 1:1 map over Arrow batches: ``fn(RecordBatch) -> RecordBatch``. With
        ``retry``, rows whose output has a non-null ``error`` go round a loop with their
        time until they succeed or are given up (the input has ``lt_attempt``); see
        :mod:`lowtide.spark.operators.retry`."""
        name = name or self._default_name("map")
        if retry is None:
            return self._then(OpSpec("map", fn, name, schema))
        if schema is None:
            raise PipelineShapeError(f"step {name!r}: a map with retry= needs its schema")
        return self._then(RetrySpec(name, fn, schema, described(lambda: retry.build(name))))

    def flat_map(self, fn: Callable[[Any], Any], schema: Any, *, name: str | None = None) -> Stream:
        """Tracked 1:N: ``fn(batch) -> (batch, parents)``; see :mod:`.operators`."""
        return self._then(OpSpec("flat_map", fn, name or self._default_name("flat_map"), schema))

    def filter(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """Tracked filter: ``fn(batch) -> boolean mask``. A SQL condition (a string or
        a Column) is :meth:`where`'s."""
        if not callable(fn):
            cond = repr(fn) if isinstance(fn, str) else "condition"
            raise PipelineShapeError(f"filter() takes a function of an Arrow batch (a "
                                     f"boolean mask), got {type(fn).__name__}: for a SQL "
                                     f"condition use where({cond})")
        return self._then(OpSpec("filter", fn, name or self._default_name("filter"), None))

    def window(self, size: str | int, *, key: str | list[str] | tuple[str, ...],
               slide: str | int | None = None,
               name: str | None = None, poll_ms: int = 100, key_ranges: int = 0,
               front_ranges: dict[int, int] | None = None) -> Windowed:
        """Exact keyed windows over global time (tumbling, or sliding with ``slide``);
        finish with ``.agg(n="count", total=("amount", "sum"))`` or ``.apply(fn,
        schema)``. ``key_ranges=N``: the fronts partition the keys into N ranges (a
        row's range is its ``front``'s: ``front % N``, or ``front_ranges[front]``) and
        a key's window is emitted once its range is complete, not the whole input. See
        :mod:`lowtide.spark.operators.windows`."""
        name = name or self._default_name("window")
        return Windowed(described(lambda: make_windowed(
            self, size, key, slide, name, poll_ms, self.pipeline.grid.delta_ms, key_ranges,
            front_ranges)))

    def speculative(self, every: str | int | None = None) -> Stream:
        """Early results of the window before it (``window(...).agg(...)``,
        ``session_window(...).agg(...)``) or of the fold (``stateful(...)``): a
        changelog with ``op`` (insert / tombstone), ``version`` and ``is_final``; a
        (key, window), session or (key, slot) that changed shows a new version at most
        every ``every`` (None: each batch), its final one once it is complete. After an
        outer or anti ``join(...)``: its outer rows early, cancelled if a match comes
        (no ``every``). See :mod:`lowtide.spark.operators.speculative`,
        ``speculative_fold``, ``speculative_sessions`` and ``speculative_join``."""
        last = self.steps[-1] if self.steps else None
        spec = described(lambda: speculative_step(last, every))
        return replace(self, steps=(*self.steps[:-1], spec))

    def session_window(self, gap: str | int | Any, *, key: str | list[str] | tuple[str, ...],
                       name: str | None = None, poll_ms: int = 100) -> Aggregated:
        """Exact keyed session windows over global time (``gap`` a duration, or a Spark
        Column of per-row gaps); finish with ``.agg(n="count", ...)``. A session is
        emitted once no row that could join it is in flight. See
        :mod:`lowtide.spark.operators.sessions`."""
        name = name or self._default_name("session_window")
        return Aggregated(described(lambda: make_sessions(
            self, gap, key, name, poll_ms, self.pipeline.grid.delta_ms)))

    def groupBy(self, *cols: str | list[str], every: str | int | None = None,
                name: str | None = None, poll_ms: int = 100) -> Aggregated:
        """Aggregation without a window: ``groupBy("word").count()``, ``.agg(...)``;
        per key, the exact running result as of the end of each range of ``every``
        (default one slot) in which it has rows, with ``as_of``. See
        :mod:`lowtide.spark.operators.running`."""
        name = name or self._default_name("groupBy")
        return Aggregated(described(lambda: make_grouped(
            self, cols, every, name, poll_ms, self.pipeline.grid.delta_ms)))

    groupby = groupBy

    def stateful(self, fn: Callable[..., tuple[Any, Any]], schema: str, *,
                 key: str | list[str] | tuple[str, ...], name: str | None = None,
                 poll_ms: int = 100, on_timer: Callable[..., tuple[Any, Any]] | None = None,
                 time_mode: str = "EventTime") -> Stream:
        """Exact keyed state in global time order: ``fn(key, rows, state) -> (state,
        out)`` once per key and complete slot, in slot order; ``out`` (pandas, columns
        of the DDL ``schema``, or None) follows the key columns. Pending rows hold the
        min time downstream. With ``on_timer``, ``fn(key, rows, state, timers)`` sets
        timers (``timers.register_timer(ms)``) and ``on_timer(key, expiry_ms, state,
        timers) -> (state, out)`` runs when one fires (``time_mode`` "EventTime": when
        the min time passes it; "ProcessingTime"). See
        :mod:`lowtide.spark.operators.keyed_state` and :mod:`lowtide.spark.operators.fold`."""
        name = name or self._default_name("stateful")
        keys = names_of(key, f"stateful {name!r}")
        mode = described(lambda: time_mode_of(time_mode, f"stateful {name!r}"))
        logic = FoldLogic(fn, name, on_timer, mode, self.pipeline.grid.delta_ms)
        return self._then(StatefulSpec(name, keys, KeptRows(logic), schema, poll_ms))

    # DataFrame-native steps, evaluated by Spark's JVM (see operators.frames)
    def where(self, condition: Any, *, name: str | None = None) -> Stream:
        """Tracked filter on a Spark ``Column`` or a SQL string (null is false)."""
        return self._then(FrameSpec("where", name or self._default_name("where"),
                                    (condition,)))

    def select(self, *cols: Any, name: str | None = None) -> Stream:
        """Like ``DataFrame.select`` (rows 1:1; ``lt_track`` is kept for you)."""
        return self._then(FrameSpec("select", name or self._default_name("select"), cols))

    def with_column(self, col_name: str, col: Any, *, name: str | None = None) -> Stream:
        """Like ``DataFrame.withColumn`` (rows 1:1)."""
        return self._then(FrameSpec("with_column", name or self._default_name("with_column"),
                                    (col_name, col)))

    def selectExpr(self, *exprs: str, name: str | None = None) -> Stream:
        """Like ``DataFrame.selectExpr`` (rows 1:1; ``lt_track`` is kept for you)."""
        return self._then(FrameSpec("select_expr", name or self._default_name("select"),
                                    exprs))

    def drop(self, *cols: Any, name: str | None = None) -> Stream:
        """Like ``DataFrame.drop`` (rows 1:1)."""
        return self._then(FrameSpec("drop", name or self._default_name("drop"), cols))

    def withColumnRenamed(self, existing: str, new: str, *, name: str | None = None
                          ) -> Stream:
        """Like ``DataFrame.withColumnRenamed`` (rows 1:1)."""
        return self._then(FrameSpec("rename", name or self._default_name("rename"),
                                    (existing, new)))

    withColumn = with_column

    def withWatermark(self, eventTime: str, delayThreshold: str) -> Stream:
        """Accepted for ported code, and not needed: this stream is unchanged. Windows,
        joins and ``dropDuplicates`` are complete when the tracker proves their input
        is (global time: the front's clock, or event time with ``Front(time_from=)``),
        not after a delay; no row is ever dropped as late."""
        return self

    def dropDuplicates(self, subset: str | list[str] | tuple[str, ...] | None = None, *,
                       within: str | int | None = None, name: str | None = None,
                       poll_ms: int = 100) -> Stream:
        """Exact ``DataFrame.dropDuplicates``: a row is dropped when a row with the same
        ``subset`` values (all columns when None) was kept at most ``within`` before it
        in global time (None: ever before). See :mod:`lowtide.spark.operators.dedup`."""
        name = name or self._default_name("dropDuplicates")
        keys = None if subset is None else names_of(subset, f"dropDuplicates {name!r}")
        delta = self.pipeline.grid.delta_ms
        window = None if within is None else duration_of(
            within, f"dropDuplicates {name!r}: within=")
        if window is not None and (window < 0 or window % delta):
            raise PipelineShapeError(f"dropDuplicates {name!r}: within={window} ms must be a "
                                     f"non-negative multiple of delta_ms={delta}")
        return self._then(DedupSpec(name, keys, None if window is None else window // delta,
                                    poll_ms))

    drop_duplicates = dropDuplicates

    def explode(self, column: Any, alias: str | None = None, *,
                name: str | None = None) -> Stream:
        """Tracked: one row per element of the array ``column`` (a name or a Column),
        in column ``alias`` (default: the column's name, replaced); rows with an empty
        or null array are dropped, like ``F.explode``."""
        if alias is None:
            if not isinstance(column, str):
                raise ValueError("explode(Column) needs an alias: explode(col, 'name')")
            alias = column
        return self._then(FrameSpec("explode", name or self._default_name("explode"),
                                    (column, alias)))

    # untracked, row-preserving
    def transform(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """Apply an untracked DataFrame -> DataFrame function. It must keep rows 1:1
        (and the tracking columns as they are), or the tracker reports the
        difference as missing or extra items."""
        return self._then(TransformSpec(fn, name or self._default_name("transform")))

    def ends_in_operator(self) -> bool:
        """Is the last step a tracked Arrow step (whose rows reach the sink unchanged)?"""
        last = self.steps[-1] if self.steps else None
        return isinstance(last, OpSpec) or (isinstance(last, FrameSpec) and last.tracked)

    def repartition(self, n: int, *cols: Any) -> Stream:
        """``DataFrame.repartition(n, *cols)``. With no columns, rows are spread by a
        hash of their tracking column rather than Spark's round robin: as even (each
        row's column is random), the same on a task's retry, and without the sort of
        every row's bytes Spark's round robin needs to be the same on a retry
        (``spark.sql.execution.sortBeforeRepartition``; 29% of the JVM's CPU for three
        repartitions and maps of 64-byte rows: docs/spark.md, "Tracked maps")."""
        def spread(df: Any) -> Any:
            by = cols or ((TRACK_COL,) if TRACK_COL in df.columns else ())
            return df.repartition(n, *by)

        return self.transform(spread, name=self._default_name("repartition"))

    # introspection
    def plan(self, sink: str = "sink") -> SegmentPlan:
        """The segment plan of this stream written to ``sink``."""
        return derive([(self, sink)])

    def segment_names(self, sink: str = "sink") -> list[str]:
        return list(self.graph(sink).names)

    def graph(self, sink: str = "sink") -> SegmentGraph:
        return self.plan(sink).graph

    def explain(self, sink: str = "sink") -> None:
        """Print the segment graph, one line per segment (``name <- inbound``),
        upstream first (the text: ``plan(sink).explain()``)."""
        print(self.plan(sink).explain())


def speculative_step(last: Any, every: str | int | None) -> Any:
    """The changelog form of ``last``: a join's, a fold's, a session window's, an
    ``apply`` window's, a ``groupBy``'s, or else a window's (which refuses any other
    step in one line)."""
    if isinstance(last, JoinSpec):
        return make_speculative_join(last, every)
    if is_fold(last) or writes_changelog(last):
        return make_speculative_fold(last, every)
    if isinstance(last, SessionSpec):
        return make_speculative_sessions(last, every)
    if isinstance(last, WindowSpec) and last.fn is not None:
        return make_speculative_apply(last, every)
    if isinstance(last, GroupedSpec):
        return make_speculative_grouped(last, every)
    return make_speculative(last, every)
