"""Exact windows planned in Spark's JVM: Spark's own ``groupBy(keys, window).agg``
(partial aggregation before the shuffle, state in the state store), made exact by
driving its watermark from the window's inbound segment ``S_in``; lowtide handles only
the acks, the stamps and one hold. The description is :mod:`.windows`; the runtime for
what this plan cannot do (``apply(fn)``, a window in a query with another stateful
step, ``key_ranges`` but as the query's last step) is :mod:`.window_state`. A window
that is its query's last step into a sink that runs ``foreachBatch`` has its results
from the driver (:mod:`.window_driver`): the same aggregation in update mode, no emit
step, each window out in the batch that completes it. The plan below is the emit
step's: into the null sink, after other steps, or into a caller's sink.

::

    rows, received and stamped by their senders: lt_ts, lt_wm (window_input)
         ∪ clock rows (lt_wm, lt_ts the same, lt_clock)      (the idle clock source)
         .withWatermark(lt_wm, 0).where(not a clock row), lt_ts marked an event-time
         column
         .groupBy(keys, window(lt_ts)).agg(...)              (append mode)
         --emit--> results into the outbound segment         (mapInArrow, few rows)

The query runs with ``multipleWatermarkPolicy=max`` and ``allowMultiple=false``
(:data:`WATERMARK_CONFS`, set only while it starts): the global watermark is then the
largest stamp of the batches so far; Spark emits a window when its end is at or below
the watermark and drops a row only if its window's end is. The stamps' argument (no
row dropped, no window emitted before its last row) is in
:mod:`lowtide.spark.tracking.receive`. ``lt_ts`` is the row's global time (``slot *
delta_ms``), added by the receive step, which unwraps every row's slot anyway (an
unwrap of ``lt_track`` planned here, with the checks a row too far from the plan's
reference needs, cost the query's thread about 2 ms of planning a micro-batch); the
window's bounds are those of today's windows (multiples of the slide).

``lt_ts`` is marked an event-time column by its metadata alone (what ``withWatermark``
writes on its column), after the stamps' watermark node: Spark's append mode and its
state eviction look for that mark on the window's time column, and its watermark is
that of the one ``EventTimeWatermark`` node, the stamps'. A second node on ``lt_ts``
(ten years back, never the maximum) did the same and cost every row its event-time
statistics outside generated code: 0.03 µs a row of the tasks' 1.37, about one
point of the window's CPU (an A/B run of the two plans, BENCHMARKS.md).

Acks (rules 1, 5, 6): the receive step acks each row out of ``S_in``; each result row is
sent into the outbound segment at slot ``end - 1`` with the id ``xxhash64(keys, start,
operator id)`` (32 bits), one keyed batch ``(query, batch, "<emit>S_in", partition)``
per task, confirmed before its rows are handed on. Between a window's completion in
``S_in`` and its emission, the hold of :mod:`.window_hold` keeps the outbound segment
from passing it (rule 7).

Aggregates have the semantics and types of :mod:`.window_aggs`, in Spark SQL:
``first``/``last`` are ``min_by``/``max_by`` over ``(slot, ack id)`` of the non-null
values, ``percentile`` the element ``ceil(p * n)`` of the sorted values,
``count_distinct`` the size of ``collect_set``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowtide.spark.operators.frames import FrameSpec
from lowtide.spark.operators.state_clock import StatefulStep, check_keys
from lowtide.spark.operators.window_aggs import TypedAgg, bind_aggs
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.sources.clock import clock_frame
from lowtide.spark.tracking.column import (
    ID_BITS,
    ID_MASK,
    TRACK_COL,
    TRACKING_COLS,
    AckAccumulator,
    reference_slot,
)
from lowtide.spark.tracking.key_ranges import RANGE_COL as FRONT_COL
from lowtide.spark.tracking.key_ranges import RANGE_HI, RANGE_LO
from lowtide.spark.tracking.receive import STAMP_COLS, TS_COL, WM_COL
from lowtide.spark.tracking.transport import TrackerRef

ORDER_COL = "lt_order"  # (time, ack id): first / last
WINDOW_COL = "lt_window"
ROW_RANGE_COL = "lt_range"  # a row's key range (rule 15)
CLOCK_COL = "lt_clock"  # true on the clock's rows, which leave after the watermark node
EMIT_PREFIX = "<emit>"
#: session confs a query with a JVM window starts with (each query keeps its own copy)
WATERMARK_CONFS = (("spark.sql.streaming.multipleWatermarkPolicy", "max"),
                   ("spark.sql.streaming.statefulOperator.allowMultiple", "false"))
#: the column metadata by which Spark knows an event-time column (an
#: ``EventTimeWatermark``'s delay, ms)
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
#: ``lt_ts``'s delay: marked as an event-time column with no watermark node of its own
TS_DELAY_MS = 3650 * 86_400_000
NAMES = (*STAMP_COLS, ORDER_COL, WINDOW_COL, ROW_RANGE_COL, CLOCK_COL, RANGE_LO, RANGE_HI)
#: DataFrame steps a window may absorb a ``where`` across
ONE_TO_ONE_OR_WHERE = ("where", "select", "select_expr", "drop", "rename", "with_column")


def stateful_steps(stream: Any) -> list[Any]:
    """The stateful steps (windows, session windows, groupBy, keyed state,
    dropDuplicates, stream-stream joins) of a stream's query."""
    from lowtide.spark.operators.dedup import DedupSpec
    from lowtide.spark.operators.joins import JoinSpec

    mine = [s for s in stream.steps if isinstance(s, StatefulStep | JoinSpec | DedupSpec)]
    return mine + [s for up in stream.inputs for s in stateful_steps(up)]


@contextmanager
def session_confs(spark: Any, confs: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """``spark``'s session confs set to ``confs`` inside the block, restored after (a
    query copies its session's confs when it starts)."""
    before = [(k, spark.conf.get(k, None)) for k, _ in confs]
    for k, v in confs:
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before:
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def has_loop(stream: Any) -> bool:
    """Does a stream's query hold a retry loop (rule 11)?"""
    from lowtide.spark.operators.retry import RetrySpec

    return any(isinstance(s, RetrySpec) for s in stream.steps) or any(
        has_loop(up) for up in stream.inputs)


def wheres_in_front(stream: Any) -> dict[str, str]:
    """The ``where`` steps of a stream's query that come right before a window, with
    only 1:1 DataFrame steps (``select``, ``with_column``, ...) or other such
    ``where``s between: their names, each with its window's. Not those right after an
    untracked step (``transform``): the window's senders, before it, receive for the
    ``where``, and a tracked ``where`` is what reports rows a transform lost."""
    out: dict[str, str] = {}
    for up in stream.inputs:
        out.update(wheres_in_front(up))
    window, chain = None, []
    for step in reversed(stream.steps):
        if isinstance(step, WindowSpec):
            window, chain = step.name, []
        elif window is not None and isinstance(step, FrameSpec) and (
                step.kind in ONE_TO_ONE_OR_WHERE):
            chain += [step.name] if step.kind == "where" else []
        else:
            if window is not None and step.segments():  # a tracked sender
                out.update(dict.fromkeys(chain, window))
            window, chain = None, []
    out.update(dict.fromkeys(chain, window) if window is not None else {})
    return out


def fallback_reason(spec: WindowSpec, stateful_steps: int, loop: bool = False,
                    on_driver: bool = False) -> str | None:
    """Why a window needs the ``transformWithState`` runtime (None: it does not);
    ``on_driver``: its key ranges' finals may come from the sink's ``foreachBatch``
    (:mod:`.window_driver`)."""
    if loop:  # a retry step sends into the window without the senders' stamps
        return "its query has a retry loop, whose step does not stamp the rows it sends"
    if spec.fn is not None:
        return "apply(fn) runs a Python function over each window's rows"
    if spec.key_ranges and not on_driver:
        return "key_ranges: each range's windows come out once that range is complete"
    if stateful_steps > 1:
        return "its query has another stateful step (Spark's watermark is global)"
    return None


def input_fields(df: Any, what: str) -> dict[str, str]:
    """The columns of a window's input that are the user's (name -> type), lowtide's
    own (``lt_track``, and the receive step's ``lt_ts`` and ``lt_wm``) left out; a
    user's column with one of the names lowtide uses raises here, in one line."""
    names = [f.name for f in df.schema.fields]
    taken = [c for c in NAMES if c in names and (c not in STAMP_COLS or names.count(c) > 1)]
    if taken:
        raise ValueError(f"{what}: column {taken[0]!r} is a name lowtide uses: rename it")
    return {f.name: f.dataType.simpleString() for f in df.schema.fields
            if f.name not in (*TRACKING_COLS, *STAMP_COLS)}


# ------------------------------------------------------------------ JVM expressions

def range_column(ranges: dict[int, int]) -> Any:
    """A row's key range, from its ``front`` column through ``ranges`` (front ->
    range): null for a front not listed (its rows fail their receive step first)."""
    from pyspark.sql import functions as F

    pairs = [F.lit(x) for f, r in sorted(ranges.items()) for x in (f, r)]
    return F.try_element_at(F.create_map(*pairs), F.col(FRONT_COL).cast("long"))


def agg_column(a: TypedAgg, col: Any) -> Any:
    """One aggregate in Spark SQL, typed as :mod:`.window_aggs` types it."""
    from pyspark.sql import functions as F

    fn = a.agg.fn
    if a.source is None:
        out = F.count(F.lit(1))
    elif fn in ("count", "sum", "min", "max"):
        out = getattr(F, fn)(col)
    elif fn == "mean":
        out = F.avg(col)
    elif fn in ("first", "last"):  # by global time, ties by ack id, nulls skipped
        by = F.min_by if fn == "first" else F.max_by
        out = by(col, F.when(col.isNotNull(), F.col(ORDER_COL)))
    elif fn == "count_distinct":
        out = F.size(F.collect_set(col))
    else:  # percentile: the smallest value with at least p of them at or below it
        values = F.array_sort(F.collect_list(col))
        k = F.greatest(F.lit(1), F.ceil(F.lit(a.agg.param or 0.0) * F.size(values)))
        out = F.when(F.size(values) > 0, F.element_at(values, k.cast("int")))
    return out.cast(a.out_type()).alias(a.agg.out)


def result_track(keys: list[Any], window: Any, op_id: int, delta_ms: int) -> Any:
    """A result row's ``lt_track``: slot ``end - 1``, id from (keys, start, operator)."""
    from pyspark.sql import functions as F

    slot = F.floor(F.unix_millis(window.end) / F.lit(delta_ms)) - F.lit(1)
    ident = F.xxhash64(*keys, window.start, F.lit(op_id)).bitwiseAND(F.lit(int(ID_MASK)))
    return F.shiftleft(slot, ID_BITS).bitwiseOR(F.greatest(ident, F.lit(1)))


# ------------------------------------------------------------------ the plan

@dataclass
class QueryWindows:
    """How the windows of one query are planned: in the JVM when its sink gives a
    checkpoint (the hold's file lives there) and nothing forces the fallback
    (:func:`fallback_reason`); ``holds`` collects the holds the query must move."""

    checkpoint: str | None
    stateful: list[Any]  # the query's stateful steps
    loop: bool = False  # a retry loop in the query
    holds: list[Any] = field(default_factory=list)
    #: each window's ``where`` steps in front of it (only 1:1 steps between), by name
    wheres: dict[str, str] = field(default_factory=dict)
    #: the speculative window whose changelog step may run on the driver (the query's
    #: last step, its sink's ``foreachBatch`` runs it: :mod:`.speculative_driver`)
    driver_step: str | None = None
    #: the window whose results may come from the driver, likewise
    #: (:mod:`.window_driver`)
    driver_window: str | None = None
    changelogs: list[Any] = field(default_factory=list)  # their driver steps

    @classmethod
    def of(cls, stream: Any, checkpoint: str | None, on_driver: bool = False,
           null_sink: bool = False) -> QueryWindows:
        """``on_driver``: the sink's ``foreachBatch`` may run a last step's driver step;
        ``null_sink``: the rows go to the null sink, which runs nothing on the driver
        (a window without key ranges keeps its emit step there: no ``foreachBatch``,
        whose call costs each batch more than the driver step saves)."""
        from lowtide.spark.operators.speculative import SpeculativeSpec

        last = stream.steps[-1] if stream.steps else None
        driver = last.name if on_driver and isinstance(last, SpeculativeSpec) else None
        window = last.name if on_driver and isinstance(last, WindowSpec) and \
            last.fn is None and (last.key_ranges or not null_sink) else None
        return cls(checkpoint, stateful_steps(stream), has_loop(stream),
                   wheres=wheres_in_front(stream), driver_step=driver, driver_window=window)

    def window_of(self, segment: str) -> str | None:
        """The window planned in the JVM whose senders send into ``segment`` (its
        inbound segment, or that of a ``where`` it absorbs): they receive and stamp
        their rows for it (:mod:`.window_input`; a speculative window's too:
        :mod:`.speculative_plan`)."""
        from lowtide.spark.operators.speculative import SpeculativeSpec

        name = self.wheres.get(segment, segment)
        windows = [s.window if isinstance(s, SpeculativeSpec) and s.jvm else s
                   for s in self.stateful]
        return name if any(isinstance(w, WindowSpec) and w.name == name and self.in_jvm(w)
                           for w in windows) else None

    def absorbs(self, step: str) -> bool:
        """Is ``step`` a ``where`` that a window planned in the JVM absorbs (Spark's
        filter, no Python pass: :mod:`lowtide.spark.tracking.receive`)?"""
        return step in self.wheres and self.window_of(step) is not None

    def plan(self, df: Any, spec: WindowSpec, ref: TrackerRef, out_segment: str,
             op_id: int, null_sink: bool = False) -> Any:
        """The window's DataFrame; ``null_sink``: it is the last step and its results go
        to Spark's ``noop`` sink."""
        if not self.in_jvm(spec):
            from lowtide.spark.operators.window_state import build_window

            return build_window(df, spec, ref, out_segment, op_id, self.checkpoint)
        from lowtide.spark.operators.window_hold import WatermarkHold

        hold = WatermarkHold(ref, spec.name, op_id, self.checkpoint, spec.slide_ms)
        # into the null sink, results would be sent and received in one task: no acks,
        # no Python pass; the hold alone keeps the sink from passing them
        emit = None if null_sink else emit_function(ref, spec.name, out_segment)
        out = build_window_plan(df, spec, ref, op_id, hold, emit)
        self.holds.append(hold)
        return out

    def in_jvm(self, spec: WindowSpec) -> bool:
        if self.checkpoint is None or fallback_reason(spec, len(self.stateful), self.loop,
                                                      self.driver_window == spec.name):
            return False
        if not spec.key_ranges:
            return True
        from lowtide.spark.operators.speculative_driver import ChangelogStore

        return ChangelogStore.usable(self.checkpoint, spec.name)

    def on_driver(self, spec: WindowSpec) -> bool:
        """Do the results of window ``spec`` come from the sink's ``foreachBatch``
        (:mod:`.window_driver`): it may (:attr:`driver_window`), it is planned in the
        JVM, and its checkpoint ran no other plan (chosen once per checkpoint)?"""
        from lowtide.spark.operators.speculative_driver import ChangelogStore

        return self.driver_window == spec.name and self.in_jvm(spec) and \
            ChangelogStore.usable(str(self.checkpoint), spec.name)

    def ends_in_window(self, stream: Any) -> bool:
        """Does ``stream`` end in a window planned in the JVM whose emit step can ack
        the null sink's receipts (not one whose results come from the driver)?"""
        last = stream.steps[-1] if stream.steps else None
        return isinstance(last, WindowSpec) and self.in_jvm(last) and not self.on_driver(last)


def build_window_plan(df: Any, spec: WindowSpec, ref: TrackerRef, op_id: int, hold: Any,
                      emit: Callable[[Iterator[Any]], Iterator[Any]] | None,
                      ranges: dict[int, int] | None = None) -> Any:
    """The DataFrame of a window step planned in the JVM (see the module docstring).
    Unknown columns and unsupported types raise here, before the query starts; then
    ``hold`` (a :class:`.window_hold.WatermarkHold`) is prepared. ``ranges``: front ->
    key range, for a window with key ranges: each result row also has the least and
    the greatest range of its rows (:data:`RANGE_LO`, :data:`RANGE_HI`)."""
    from pyspark.sql import functions as F

    what = f"window {spec.name!r}"
    fields = input_fields(df, what)
    check_keys(what, spec.keys, fields)
    aggs, columns = bind_aggs(spec.name, spec.aggs, fields)
    delta = ref.grid.delta_ms
    picked = [F.col(f"`{c}`") for c in dict.fromkeys([*spec.keys, *columns])]
    extra = [F.struct(F.col(TS_COL).alias("time"), F.col(TRACK_COL).bitwiseAND(
        F.lit(int(ID_MASK))).alias("ack")).alias(ORDER_COL)] \
        if any(a.agg.fn in ("first", "last") for a in aggs) else []
    dropped = [c for c in STAMP_COLS if c not in df.columns]
    if dropped:
        raise ValueError(f"{what}: a step before it dropped the column {dropped[0]!r} its "
                         "senders add: keep it (like lt_track)")
    ranged = [] if ranges is None else [range_column(ranges).alias(ROW_RANGE_COL)]
    rows = df.select(*picked, *extra, *ranged, F.col(TS_COL), F.col(WM_COL))
    hold.prepare()
    clock = clock_frame(df.sparkSession, ref, spec.name, spec.slide_ms,
                        (op_id, hold.checkpoint))
    # The clock's rows have a time too: the window's filter of rows without one is
    # pushed below the watermark node, and would drop them before it saw their stamp
    # (the watermark then moved only with data). They leave after the node, by a
    # filter on its own column, which Spark does not push below it.
    clock = clock.select(F.col(WM_COL), F.timestamp_millis(F.col(WM_COL)).alias(TS_COL),
                         F.lit(True).alias(CLOCK_COL))
    timed = (rows.unionByName(clock, allowMissingColumns=True)
             .withColumn(WM_COL, F.timestamp_millis(F.col(WM_COL)))
             .withWatermark(WM_COL, "0 seconds")
             .where(F.col(CLOCK_COL).isNull() | F.col(WM_COL).isNull())
             .drop(CLOCK_COL)
             .withMetadata(TS_COL, {WATERMARK_DELAY_KEY: TS_DELAY_MS}))
    window = F.window(TS_COL, f"{spec.size_ms} milliseconds", f"{spec.slide_ms} milliseconds")
    keys = [F.col(f"`{k}`") for k in spec.keys]
    bounds = [] if ranges is None else [F.min(ROW_RANGE_COL).alias(RANGE_LO),
                                        F.max(ROW_RANGE_COL).alias(RANGE_HI)]
    grouped = timed.groupBy(*keys, window.alias(WINDOW_COL)).agg(
        *[agg_column(a, None if a.source is None else F.col(f"`{columns[a.source]}`"))
          for a in aggs], *bounds)
    w = F.col(WINDOW_COL)
    out = grouped.select(*keys, w.start.alias("window_start"), w.end.alias("window_end"),
                         *[F.col(f"`{a.agg.out}`") for a in aggs],
                         *[F.col(c) for c in (RANGE_LO, RANGE_HI) if ranges is not None],
                         result_track(keys, w, op_id, delta).alias(TRACK_COL))
    return out if emit is None else out.mapInArrow(emit, out.schema)


def emit_function(ref: TrackerRef, in_segment: str, out_segment: str
                  ) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The emit step (``mapInArrow`` over the results): their send-acks into
    ``out_segment``, one keyed batch per task, confirmed before the rows go on."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from lowtide.spark.sources.log_source import submit_task_batch
        from lowtide.spark.tracking.receive import task_partition

        idx = ref.graph.index(out_segment)
        acc = AckAccumulator()
        ref_slot = reference_slot(ref.grid)
        held = []
        for b in batches:
            packed = b.column(b.schema.get_field_index(TRACK_COL)).to_numpy(
                zero_copy_only=False)
            acc.add_packed(idx, np.asarray(packed, np.int64), ref_slot, +1)
            held.append(b)
        submit_task_batch(ref, EMIT_PREFIX + in_segment, task_partition(), acc).wait()
        yield from held

    return run
