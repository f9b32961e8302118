"""DataFrame-native steps cross into Python no more often than the untracked query
would: counted in the physical plan of the running query (the nodes whose rows go to
a Python worker), or, for a window, in the analyzed plan (each of its Python nodes
becomes one of the physical plan's; no query has to run). ``select`` and
``with_column`` add no node at all, in front of a window too; a ``where`` shares the
task of the tracked Arrow step after it, as Spark's filter shares the ``mapInArrow``
after it."""

from __future__ import annotations

import re
import tempfile
from typing import Any

import pyarrow as pa
import pytest

import lowtide
from lowtide.spark.pipeline import register_sources
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import executed_plan

pytestmark = pytest.mark.spark

SPEC = GeneratorSpec(fronts=2, rate=200.0)
#: physical operators that hand their rows to a Python worker, and Python data sources
PYTHON_NODES = re.compile(r"^[\s:+\-!*()\d]*(MapInArrow|MapInPandas|ArrowEvalPython|"
                          r"BatchEvalPython|FlatMapGroupsInPandas\w*|FlatMapCoGroupsIn\w+|"
                          r"TransformWithStateIn\w+|\w+ \(Python\)|MicroBatchScan.*\(Python\))\b",
                          re.M)


def crossings(query: Any) -> list[str]:
    """The Python nodes of ``query``'s last executed plan (once it ran a batch)."""
    return [m.group(1).split(" ")[0] for m in PYTHON_NODES.finditer(executed_plan(query))]


def planned(df: Any) -> list[str]:
    """The Python operators of ``df``'s analyzed plan, from the sink down."""
    todo, out = [df._jdf.queryExecution().analyzed()], []
    while todo:
        node = todo.pop()
        if PYTHON_NODES.match(node.nodeName()):
            out.append(node.nodeName())
        todo.extend(node.children().apply(i) for i in range(node.children().size()))
    return out


def plus_one(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"], "k": b["k"]})


def tracked(spark: Any, build: Any) -> list[str]:
    pipe = lowtide.Pipeline(spark, "crossings", stuck_after_ms=600_000)
    try:
        query = build(pipe.generate(SPEC)).to_null(checkpoint=tempfile.mkdtemp())
        try:
            return crossings(query.query)
        finally:
            query.stop()
    finally:
        pipe.close()


def untracked(spark: Any, build: Any) -> list[str]:
    register_sources(spark)
    df = (spark.readStream.format("lowtide_gen").option("tracking", "false")
          .option("spec", SPEC.to_json()).load())
    query = (build(df).writeStream.format("noop")
             .option("checkpointLocation", tempfile.mkdtemp()).start())
    try:
        return crossings(query)
    finally:
        query.stop()


def test_select_and_with_column_add_no_python_node_in_front_of_a_window(spark) -> None:
    from pyspark.sql import functions as F

    def window(build: Any) -> list[str]:
        pipe = lowtide.Pipeline(spark, "crossings-window")
        try:
            stream = build(pipe.generate(SPEC)).window("1 second", key="k").agg(n="count")
            return planned(pipe.build(stream).df)
        finally:
            pipe.close()

    bare = window(lambda s: s.with_column("k", F.col("seq") % 3))
    assert bare, "the window has a Python node (or Spark renamed it: see PYTHON_NODES)"
    assert window(lambda s: s.select("front", "seq").with_column("k", F.col("seq") % 3)
                  .with_column("seq2", F.col("seq") * 2)) == bare
    # the same steps in plain Spark add none either
    plain = untracked(spark, lambda df: df.select("front", "seq").withColumn("k", F.col("seq") % 3))
    assert plain == untracked(spark, lambda df: df)


def test_a_where_shares_the_tracked_map_after_it(spark) -> None:
    """where + with_column + a tracked map: as many Python nodes as Spark's where +
    withColumn + mapInArrow (the source's scan and one Arrow step)."""
    from pyspark.sql import functions as F

    def plain(df: Any) -> Any:
        return (df.withColumn("k", F.col("seq") % 3).where("seq % 2 = 0")
                .mapInArrow(lambda bs: (plus_one(b) for b in bs), "front int, seq long, k long"))

    def mine(s: Any) -> Any:
        return (s.with_column("k", F.col("seq") % 3).where("seq % 2 = 0")
                .map(plus_one, "front int, seq long, k long", name="plus"))

    got, want = tracked(spark, mine), untracked(spark, plain)
    assert got == want, f"lowtide {got} against Spark {want}"


def test_a_where_in_front_of_a_window_adds_no_python_node(spark, tmp_path) -> None:
    """where + with_column + where + a window planned in Spark's JVM: no Python node
    but the source's scan, as in Spark's where + withColumn + window (the window
    absorbs the wheres: its senders receive their rows)."""
    from pyspark.sql import functions as F

    pipe = lowtide.Pipeline(spark, "crossings-where-window")
    try:
        stream = (pipe.generate(SPEC).where("seq % 2 = 0", name="even")
                  .with_column("k", F.col("seq") % 3).where("k != 1", name="not1")
                  .window("1 second", key="k", name="w").agg(n="count"))
        # into the null sink: no emit step (its results' send-acks, a few rows a window)
        got = planned(pipe.build(stream, null_sink=True, checkpoint=str(tmp_path / "c")).df)
    finally:
        pipe.close()
    register_sources(spark)
    df = (spark.readStream.format("lowtide_gen").option("tracking", "false")
          .option("spec", SPEC.to_json()).load())
    plain = (df.where("seq % 2 = 0").withColumn("k", F.col("seq") % 3).where("k != 1")
             .withColumn("ts", F.timestamp_millis(F.col("seq"))).withWatermark("ts", "1 second")
             .groupBy("k", F.window("ts", "1 second")).count())
    assert got == planned(plain) == [], f"lowtide {got} against Spark {planned(plain)}"


def test_a_where_after_a_transform_keeps_its_own_tracked_pass(spark, tmp_path) -> None:
    """A transform must keep rows 1:1; a tracked where after it is what reports the
    rows it lost, so the window does not absorb that where (its senders come before
    the transform)."""
    from lowtide.spark.operators.window_plan import wheres_in_front

    pipe = lowtide.Pipeline(spark, "crossings-transform-where")
    try:
        def build(s: Any) -> Any:
            return (s.where("seq % 2 = 0", name="even")
                    .window("1 second", key="front", name="w").agg(n="count"))

        assert wheres_in_front(build(pipe.generate(SPEC))) == {"even": "w"}
        after = build(pipe.generate(SPEC).transform(lambda df: df, name="t"))
        assert wheres_in_front(after) == {}
        got = planned(pipe.build(after, null_sink=True, checkpoint=str(tmp_path / "c")).df)
    finally:
        pipe.close()
    assert got, "the where after the transform has no Python pass of its own"
