"""The DataFrame plan of a pipeline's sources and steps: a source's streaming
DataFrame, one step, or tracked Arrow steps chained into one ``mapInArrow``, on top of
the DataFrame before it; and the union of a stream's inputs.
:class:`~lowtide.spark.pipeline.builder.Pipeline` decides which steps go together and
where each one's senders send."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lowtide.spark.operators.dedup import DedupSpec, dedup_input
from lowtide.spark.operators.frames import (
    KEEP_COL,
    POS_COL,
    FrameSpec,
    check_added,
    plan_frame,
    spark_step,
    where_in_jvm,
)
from lowtide.spark.operators.joins import joined
from lowtide.spark.operators.keyed_state import KeyedStep, StatefulSpec
from lowtide.spark.operators.retry import RetrySpec, loop_input, retry_task
from lowtide.spark.operators.speculative import SpeculativeSpec
from lowtide.spark.operators.speculative_plan import build_speculative_plan
from lowtide.spark.operators.state_processor import build_keyed
from lowtide.spark.operators.tracked import OpRuntime, OpSpec, operator_id, task_function
from lowtide.spark.operators.window_driver import build_driver_window
from lowtide.spark.operators.window_input import FORMAT, receiving_task, with_stamp
from lowtide.spark.operators.window_plan import QueryWindows
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.pipeline.dag import PipelineShapeError, source_key
from lowtide.spark.pipeline.data_sources import source_schema
from lowtide.spark.pipeline.describe import described
from lowtide.spark.pipeline.sources import SourceSpec
from lowtide.spark.pipeline.stream import Step, TransformSpec
from lowtide.spark.sources.log_replay import RANGE_OPTION
from lowtide.spark.sources.read_stream import EntrySpec, entry_schema
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.key_ranges import RANGE_COL
from lowtide.spark.tracking.receive import STAMP_COLS
from lowtide.spark.tracking.transport import TrackerRef

#: Spark 4.1 and later re-plan a stateless streaming query's stages in every micro-batch
#: from the statistics of the stages before (adaptive execution). A lowtide query runs
#: the plan it was given instead, for the cost: the re-planning cost the tracked maps
#: about three points of CPU, against none to two for the same maps untracked
#: (BENCHMARKS.md, twenty-second session). Its tasks, which key its acks (rule 5),
#: then stay as planned.
FIXED_PLAN_CONFS = (("spark.sql.adaptive.streaming.stateless.enabled", "false"),)


def fixed_plan_confs(spark: Any) -> tuple[tuple[str, str], ...]:
    """:data:`FIXED_PLAN_CONFS` but those the session sets itself: a user who turned
    adaptive execution on for stateless streaming queries keeps it."""
    return tuple((k, v) for k, v in FIXED_PLAN_CONFS if spark.conf.get(k, None) is None)


@dataclass(frozen=True)
class Targets:
    """Where a plan's senders send: ``after`` maps each tracked step and source to
    its receiver's segment; ``sink`` is the sink segment; ``windows``: the query's
    windows planned in Spark's JVM, whose senders receive for them."""

    ref: TrackerRef
    after: dict[str, str]
    sink: str
    windows: QueryWindows


def with_tracking(schema: Any) -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    if isinstance(schema, str):
        return f"{schema}, {TRACK_COL} long"
    if isinstance(schema, StructType):
        return StructType([*schema.fields, StructField(TRACK_COL, LongType(), False)])
    raise PipelineShapeError(f"schema must be a DDL string or StructType, got "
                             f"{type(schema).__name__}")


def ends_in_arrow_map(step: Step | EntrySpec) -> bool:
    """Does ``step`` end in a tracked ``mapInArrow`` (to chain the next ones into)?"""
    return isinstance(step, OpSpec | EntrySpec) or (isinstance(step, FrameSpec) and step.tracked)


def plan_steps(df: Any, group: list[Step | EntrySpec], to: Targets, null_sink: bool,
               trace_file: str | None) -> Any:
    """The DataFrame plan of one step, or of tracked Arrow steps chained into one
    ``mapInArrow``, on top of ``df``; checks what can be checked before the query
    starts (see :mod:`lowtide.spark.operators.frames`)."""
    ref, after, sink_name = to.ref, to.after, to.sink
    step = group[0]
    out_segment = after.get(step.name, sink_name)
    if isinstance(step, TransformSpec):
        out = spark_step(step.name, lambda: step.fn(df))
        check_added(df, out, step.name)
        return out
    if isinstance(step, WindowSpec) and to.windows.on_driver(step):
        return described(lambda: build_driver_window(df, step, to.windows, ref, out_segment,
                                                     operator_id(step.name)))
    if isinstance(step, WindowSpec):
        return described(lambda: to.windows.plan(df, step, ref, out_segment,
                                                 operator_id(step.name), null_sink))
    if isinstance(step, SpeculativeSpec) and step.jvm and to.windows.in_jvm(step.window):
        return described(lambda: build_speculative_plan(df, step, to.windows, ref, out_segment,
                                                        operator_id(step.name)))
    if isinstance(step, DedupSpec):
        df, keyed = described(lambda: dedup_input(df, step))
        return keyed_plan(df, keyed, ref, out_segment, step.name)
    if isinstance(step, KeyedStep):  # session windows, groupBy().agg()
        df, keyed = described(lambda: step.keyed_input(df, ref.grid.delta_ms))
        return keyed_plan(df, keyed, ref, out_segment, step.name)
    if isinstance(step, StatefulSpec):
        return keyed_plan(df, step, ref, out_segment, step.name)
    if isinstance(step, RetrySpec):  # its input: df and its loop's rows (rule 11)
        both = described(lambda: loop_input(df, step, ref))
        task = retry_task(step.runtime(ref, out_segment))
        return spark_step(step.name, lambda: both.mapInArrow(task, with_tracking(step.schema)))
    if isinstance(step, FrameSpec) and to.windows.absorbs(step.name):
        check_range_col(ref, step.name, df)
        return where_in_jvm(df, step)  # its window receives its rows (window_input)
    if isinstance(step, FrameSpec):
        planned = plan_frame(df, step)
        kept = [c for c in STAMP_COLS if c in df.columns and c not in planned.columns]
        if kept:  # a select keeps the receive step's columns too
            planned = plan_frame(df, replace(step, args=(*step.args, *kept)))
        df = planned
        if not step.tracked:
            return df
    check_range_col(ref, step.name, df)
    if isinstance(step, EntrySpec):
        schema = entry_schema(df, step.time_col, step.ack_col)
    else:
        schema = arrow_output(df.schema)
    chain = []
    for i, s in enumerate(group):
        last = null_sink and i == len(group) - 1
        if isinstance(s, OpSpec):
            kind, fn = s.kind, s.fn
            if s.kind != "filter" and s.schema is not None:
                schema = with_tracking(s.schema)
        elif isinstance(s, EntrySpec):
            kind, fn = "entry", s.labels()
        else:  # the group's first step: a tracked DataFrame step's Arrow half
            assert isinstance(s, FrameSpec)
            kind, fn = s.kind, None
        chain.append(OpRuntime(kind, fn, ref, s.name, after.get(s.name, sink_name),
                               operator_id(s.name), last, trace_file if last else None))
    run = task_function(*chain)
    target = chain[-1].out_segment
    window = to.windows.window_of(target)
    if window is not None:  # a window planned in the JVM receives here
        run = receiving_task(run, ref, window, chain[-1].in_segment, out_of=target)
        schema = with_stamp(schema)
    return spark_step(step.name, lambda: df.mapInArrow(run, schema))


def check_range_col(ref: TrackerRef, segment: str, df: Any) -> None:
    """Rows received from a segment split into key ranges carry their front (their
    range, rule 15): a one-line error where a step before dropped it."""
    g = ref.graph
    if segment in g and g.ranges_of(g.index(segment)) and RANGE_COL not in df.columns:
        raise PipelineShapeError(f"step {segment!r}: its rows are split into key ranges by "
                                 f"their front, but have no {RANGE_COL!r} column: keep it "
                                 f"(in select, in a map's schema), or add each row's front "
                                 f"as {RANGE_COL!r} (read_stream)")


def read_source(spark: Any, src: SourceSpec, to: Targets) -> Any:
    """The streaming DataFrame of source ``src``, sending into its receiver's segment
    (a window planned in the JVM in front of it receives in the source's tasks)."""
    opts = dict(src.options)
    opts["lowtide.tracker"] = to.ref.to_option()
    out = to.after[source_key(src)]
    if src.kind == "log":
        fmt = "lowtide_log_replay" if RANGE_OPTION in opts else "lowtide_log"
        opts["lowtide.segment"] = source_key(src)
        opts["lowtide.out"] = out
    else:
        fmt = "lowtide_gen"
        opts["lowtide.segment"] = out
    window = to.windows.window_of(out)
    if window is not None:  # a window planned in the JVM receives in its tasks
        opts.update({"lowtide.inner": fmt, "lowtide.receive": window,
                     "lowtide.receive_from": out, "lowtide.sender": source_key(src)})
        fmt = FORMAT
    # the schema given: Spark would start a Python process to ask the source for it
    # (seconds of a query's start-up on a busy machine)
    schema = source_schema(fmt, opts)
    return spark.readStream.format(fmt).options(**opts).schema(schema).load()


def keyed_plan(df: Any, step: StatefulSpec, ref: TrackerRef, out_segment: str, name: str) -> Any:
    """A keyed stateful step's plan (``stateful``, a join's, ``dropDuplicates``'), its
    output as the user sees it."""
    out = described(lambda: build_keyed(df, step, ref, out_segment, operator_id(name)))
    return joined(out, step)


def arrow_output(schema: Any) -> Any:
    """The schema of ``schema``'s rows after a tracked Arrow step that keeps their
    columns: a DataFrame step's helper column gone, ``lt_track`` last."""
    from pyspark.sql.types import StructType

    helpers = (KEEP_COL, POS_COL, TRACK_COL)
    return with_tracking(StructType([f for f in schema.fields if f.name not in helpers]))


def union_by_name(dfs: list[Any]) -> Any:
    """``unionByName`` of ``dfs``, or a one-line error naming the columns that differ
    (by name and type; Spark's own error is a page of plan)."""
    first = {f.name: f.dataType.simpleString() for f in dfs[0].schema.fields}
    for i, df in enumerate(dfs[1:], start=2):
        other = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        if other != first:
            diff = sorted(f"{n} {first.get(n, '-')} vs {other.get(n, '-')}"
                          for n in first.keys() | other.keys() if first.get(n) != other.get(n))
            raise PipelineShapeError(f"union: input 1 and input {i} differ in columns: "
                                     f"{'; '.join(diff)}")
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out
