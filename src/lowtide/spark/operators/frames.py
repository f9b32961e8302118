"""DataFrame-native steps: ``select``, ``with_column``, ``where``, ``explode`` and
stream-static joins (``enrich``), evaluated by Spark's JVM (SQL functions,
``from_json``, UDFs) and tracked by lowtide.

How each is acked (rules 1, 2, 5, 6), without a Python pass where none is needed:

* ``select`` and ``with_column`` keep rows 1:1, so they need no acks at all: a row
  keeps its identity, and ``lt_track`` rides along (``select`` appends it). They are
  untracked steps whose 1:1-ness is checked when the plan is built: only ``Project``
  nodes may be added (a generator inside a ``select`` is refused: use ``explode``).
* ``where(condition)`` drops rows. The JVM evaluates the condition into a boolean
  column (null counts as false, like SQL's WHERE); a tracked ``mapInArrow`` step in
  the same task (no shuffle in between) drops the rows and acks exactly as the Arrow
  ``filter`` does: every input row received, each kept row sent as a child with a
  deterministic id, one keyed batch per task, submitted once the task's input is
  exhausted and confirmed before it ends. Its Python side is one vectorised pass
  (Arrow filter + the shared ack arithmetic), no user code.
  A ``where`` in front of a window planned in Spark's JVM (only 1:1 steps between) is
  Spark's filter alone: the window absorbs it (:func:`where_in_jvm`).
* ``explode(column)`` makes rows. The JVM runs ``posexplode_outer``: each array
  element is a row with its position, a parent with no element one row with a null
  position. The tracked step after it receives each parent once (its row of position
  0 or null) and sends each element as the child ``child_ids(parent id, salt,
  position)``: the same ids in every attempt, whatever the batch boundaries.
* ``enrich`` (``stream.join(static_df, on, how)``, a stream-static join) drops or
  multiplies rows, and is acked like ``explode``: the static side gets a position per
  key (``row_number`` over its rows with that key, ordered by all its columns:
  deterministic when its data is), the JVM joins the stream left-outer with it
  (broadcast when Spark finds it small), and the same Arrow half receives each stream
  row once (its row of position 0, or its unmatched row) and sends each match as the
  child ``child_ids(parent id, salt, position)``. An unmatched row has a null position:
  under ``inner`` it is dropped (received, no child), under ``left`` its position is 0
  (one child, the static columns null).

Every step is checked when the plan is built, before the query starts: Spark's
analysis errors (unknown columns, wrong types) and non-deterministic expressions
(``rand()``, UDFs marked non-deterministic) become one-line ``ValueError``s naming
the step; a step that loses ``lt_track`` is refused the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.core.errors import LowtideError
from lowtide.spark.tracking.column import (
    TRACK_COL,
    AckAccumulator,
    TimeGroups,
    as_u64,
    child_ids,
    track_children,
    with_ids,
)
from lowtide.spark.tracking.receive import STAMP_COLS

TRACKED_FRAME_KINDS = ("where", "explode", "enrich")
KEEP_COL = "_lt_keep"  # where: the condition, evaluated by the JVM
POS_COL = "_lt_pos"  # explode, enrich: the child's position (null: a parent with none)
ENRICH_HOWS = ("inner", "left")


@dataclass(frozen=True)
class FrameSpec:
    """A DataFrame-native step: ``args`` are what the user gave (Columns, SQL strings)."""

    kind: str
    name: str
    args: tuple[Any, ...]

    @property
    def tracked(self) -> bool:
        return self.kind in TRACKED_FRAME_KINDS

    def segments(self) -> list[str]:
        """Its inbound segment if it is tracked (rows it drops or makes), else none."""
        return [self.name] if self.tracked else []


class StepError(LowtideError, ValueError):
    """A step that cannot be tracked, found when the plan is built."""


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return re.sub(r"\s*SQLSTATE: \w+;?$", "", line)


def spark_step(name: str, build: Any) -> Any:
    """``build()``, with Spark's analysis errors made one line naming the step."""
    from pyspark.errors import PySparkException

    try:
        return build()
    except PySparkException as err:
        raise StepError(f"step {name!r}: {first_line(err)}") from None


def plan_frame(df: Any, spec: FrameSpec) -> Any:
    """The JVM part of a DataFrame-native step (for ``where`` and ``explode``, the
    tracked Arrow step that follows is :func:`frame_acks`)."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    kind, args = spec.kind, spec.args
    if kind in ("select", "select_expr", "drop", "rename", "with_column"):
        out = _project(df, spec)
        check_added(df, out, spec.name, ("Project",))
        return out
    if kind == "where":
        cond = args[0] if isinstance(args[0], Column) else F.expr(args[0])
        out = spark_step(spec.name, lambda: df.withColumn(
            KEEP_COL, F.coalesce(cond.cast("boolean"), F.lit(False))))
        check_added(df, out, spec.name, ("Project",))
        return out
    if kind == "explode":
        col, alias = args
        source = F.col(col) if isinstance(col, str) else col
        keep = [c for c in df.columns if c != alias]
        out = spark_step(spec.name, lambda: df.select(
            *keep, F.posexplode_outer(source).alias(POS_COL, alias)))
        check_added(df, out, spec.name, ("Project", "Generate"))
        return out
    if kind == "enrich":
        return _plan_enrich(df, spec)
    raise ValueError(f"unknown DataFrame step {kind!r}")


def where_in_jvm(df: Any, spec: FrameSpec) -> Any:
    """A ``where`` that a window planned in the JVM absorbs: Spark's own filter (checked
    as :func:`plan_frame` checks it), no Arrow half; the window's senders receive its
    rows (:mod:`lowtide.spark.tracking.receive`)."""
    from pyspark.sql import functions as F

    return plan_frame(df, spec).where(F.col(KEEP_COL)).drop(KEEP_COL)


def _project(df: Any, spec: FrameSpec) -> Any:
    """A step that keeps rows 1:1 (``select``, ``selectExpr``, ``drop``,
    ``withColumnRenamed``, ``withColumn``), ``lt_track`` kept: a ``select`` that does
    not name it gets it appended, the others may not touch it."""
    kind, args = spec.kind, spec.args
    if kind in ("select", "select_expr"):
        method = df.select if kind == "select" else df.selectExpr
        out = spark_step(spec.name, lambda: method(*args))
        if TRACK_COL not in out.columns:
            out = spark_step(spec.name, lambda: method(*args, TRACK_COL))
        return out
    named = args[:1] if kind == "with_column" else args  # the names it writes or drops
    if any(isinstance(a, str) and a == TRACK_COL for a in named):
        raise StepError(f"step {spec.name!r}: {TRACK_COL!r} is lowtide's tracking column")
    ours = [a for a in named if isinstance(a, str) and a in STAMP_COLS and a in df.columns]
    if ours:  # a window's receive step added them (tracking.receive)
        raise StepError(f"step {spec.name!r}: {ours[0]!r} is a column lowtide adds for the "
                        "window after it: keep it as it is (name yours otherwise)")
    if kind == "drop":
        return spark_step(spec.name, lambda: df.drop(*args))
    if kind == "rename":
        return spark_step(spec.name, lambda: df.withColumnRenamed(*args))
    return spark_step(spec.name, lambda: df.withColumn(*args))


# ------------------------------------------------------------------ stream-static joins

def enrich_spec(name: str, static: Any, keys: tuple[str, ...], how: str) -> FrameSpec:
    """The step of ``stream.join(static, on=keys, how=how)``; what can be checked
    without the stream's columns is checked here, where the pipeline is described."""
    from pyspark.sql import DataFrame

    if not isinstance(static, DataFrame):
        raise StepError(f"step {name!r}: join() takes a Stream (with within=) or a "
                        f"static pyspark DataFrame, got {type(static).__name__}")
    if static.isStreaming:
        raise StepError(f"step {name!r}: the other side is a streaming DataFrame: for a "
                        "stream-stream join, read it as a Stream of this pipeline and "
                        "join with within=")
    how = {"left_outer": "left", "leftouter": "left"}.get(how, how)
    if how not in ENRICH_HOWS:
        why = ("the static side's unmatched rows would be emitted again in every "
               "micro-batch" if how in ("right", "full", "outer", "right_outer",
                                        "full_outer", "fullouter", "rightouter")
               else "a stream-static join keeps or drops stream rows")
        raise StepError(f"step {name!r}: how={how!r}: a stream-static join is 'inner' or "
                        f"'left' ({why})")
    for col in (TRACK_COL, POS_COL, KEEP_COL):
        if col in static.columns:
            raise StepError(f"step {name!r}: the static side has column {col!r}, a name "
                            "lowtide uses: rename it")
    for key in keys:
        if key not in static.columns:
            raise StepError(f"step {name!r}: key {key!r} is not a column of the static "
                            f"side (it has {', '.join(static.columns)})")
    _check_plan_deterministic(static, name)
    return FrameSpec("enrich", name, (static, keys, how))


def _plan_enrich(df: Any, spec: FrameSpec) -> Any:
    """The JVM half of a stream-static join: the stream left-outer joined with the
    static side and its per-key positions (see the module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    static, keys, how = spec.args
    name = spec.name
    types = {f.name: f.dataType for f in static.schema.fields}
    for key in keys:
        if key not in df.columns:
            raise StepError(f"step {name!r}: key {key!r} is not a column of the stream "
                            f"(it has {', '.join(c for c in df.columns if c != TRACK_COL)})")
        mine, theirs = df.schema[key].dataType.simpleString(), types[key].simpleString()
        if mine != theirs:
            raise StepError(f"step {name!r}: key {key!r} is {mine} in the stream but "
                            f"{theirs} in the static side: cast one of them")
    stream_cols = {c.lower() for c in df.columns}
    both = [c for c in static.columns if c.lower() in stream_cols and c not in keys]
    if both:
        raise StepError(f"step {name!r}: column {both[0]!r} is on both sides (not a key): "
                        "rename or drop it on one side first")
    # a static row's rank among its key's rows, by all its columns (a map by its entries)
    cols = {f.name: F.col("`" + f.name.replace("`", "``") + "`") for f in static.schema.fields}
    ranked = [F.map_entries(cols[f.name]) if isinstance(f.dataType, MapType) else cols[f.name]
              for f in static.schema.fields]
    order = Window.partitionBy(*(cols[k] for k in keys)).orderBy(*ranked)
    positioned = spark_step(name, lambda: static.withColumn(
        POS_COL, F.row_number().over(order) - 1))
    out = spark_step(name, lambda: df.join(positioned, on=list(keys), how="left"))
    if how == "left":  # an unmatched row is kept: one child, at position 0
        out = out.withColumn(POS_COL, F.coalesce(F.col(POS_COL), F.lit(0)))
    return out


# ------------------------------------------------------------------ plan checks

def _node_count(df: Any) -> int:
    """Nodes in ``df``'s analyzed plan (each is one numbered line of its tree)."""
    tree = df._jdf.queryExecution().analyzed().numberedTreeString()
    return sum(1 for line in tree.splitlines() if line[:1].isdigit())


def check_added(before: Any, after: Any, step: str,
                allowed: tuple[str, ...] | None = None) -> None:
    """What ``step`` added on top of ``before``'s plan: only deterministic expressions,
    ``lt_track`` kept, and only ``allowed`` nodes (None: any; an untracked
    ``transform`` is trusted to keep rows 1:1, the tracker reports it otherwise)."""
    if TRACK_COL not in after.columns:
        raise StepError(f"step {step!r} drops the tracking column {TRACK_COL!r}: keep it "
                        "(untracked steps must keep rows 1:1 and lt_track as it is)")
    added = _node_count(after) - _node_count(before)
    node = after._jdf.queryExecution().analyzed()
    for _ in range(max(added, 0)):
        kind = node.nodeName()
        if allowed is not None and kind not in allowed:
            hint = " (use .explode())" if kind == "Generate" else \
                " (use .where())" if kind == "Filter" else ""
            raise StepError(f"step {step!r} adds a {kind} to the plan: it must keep rows "
                            f"1:1{hint}")
        _check_deterministic(node, step)
        if node.children().size() == 0:
            break
        node = node.children().apply(0)


def _check_plan_deterministic(df: Any, step: str) -> None:
    """Every node of ``df``'s analyzed plan has only deterministic expressions (a
    static side is recomputed in every micro-batch and every task retry)."""
    todo = [df._jdf.queryExecution().analyzed()]
    while todo:
        node = todo.pop()
        _check_deterministic(node, step)
        children = node.children()
        todo.extend(children.apply(i) for i in range(children.size()))


def _check_deterministic(node: Any, step: str) -> None:
    exprs = node.expressions()
    for i in range(exprs.size()):
        e = exprs.apply(i)
        if not e.deterministic():
            name = e.name() if e.nodeName() == "Alias" else e.sql()
            raise StepError(f"step {step!r}: column {name!r} is not deterministic "
                            f"({e.sql()}); Spark re-runs tasks, and a re-run must "
                            "produce the same rows")


# ------------------------------------------------------------------ acks (executors)


def frame_acks(kind: str, batch: Any, acc: AckAccumulator, segments: tuple[int, int],
               ref_slot: int, salt: int) -> Any:
    """The tracked Arrow half of ``where`` / ``explode`` / ``enrich`` on one batch:
    record its acks in ``acc`` and return the output rows (tracking column included).
    ``enrich`` is ``explode``'s half: a stream row's matches are its elements."""
    import pyarrow as pa

    names = batch.schema.names
    packed = np.asarray(batch.column(names.index(TRACK_COL)).to_numpy(zero_copy_only=False),
                        np.int64)
    if kind == "where":
        mask = np.asarray(batch.column(names.index(KEEP_COL)).to_numpy(zero_copy_only=False),
                          bool)
        c_packed = track_children(acc, segments, packed, ref_slot, salt, mask)
        out = batch.filter(pa.array(mask, pa.bool_())) if len(mask) else batch
        out = out.drop_columns([KEEP_COL, TRACK_COL])
        return out.append_column(TRACK_COL, pa.array(c_packed, pa.int64()))
    pos_arr = batch.column(names.index(POS_COL))
    valid = np.asarray(pos_arr.is_valid().to_numpy(zero_copy_only=False), bool)
    pos = np.asarray(pos_arr.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    parent = ~valid | (pos == 0)  # one row per parent: its first element, or none
    acc.add_packed(segments[0], packed[parent], ref_slot, -1)
    kept = packed[valid]
    ids = child_ids(as_u64(kept).astype(np.uint32), salt, pos[valid])
    c_packed = with_ids(kept, ids.astype(np.uint64))
    acc.add_grouped(segments[1], TimeGroups.of_packed(c_packed, ref_slot),
                    ids.astype(np.uint64), +1)
    out = batch.filter(pa.array(valid, pa.bool_())) if len(valid) else batch
    out = out.drop_columns([POS_COL, TRACK_COL])
    return out.append_column(TRACK_COL, pa.array(c_packed, pa.int64()))
