"""A lowtide query runs the plan it was given: Spark's adaptive execution, which
re-plans a stateless streaming query's stages in each micro-batch, is off for it
unless the session turned it on itself (``step_plans.FIXED_PLAN_CONFS``)."""

from __future__ import annotations

import tempfile
from typing import Any

import pyarrow as pa
import pytest

import lowtide
from lowtide.spark.pipeline import register_sources
from lowtide.spark.pipeline.step_plans import FIXED_PLAN_CONFS
from lowtide.spark.sources.generator import UNTRACKED_SCHEMA, GeneratorSpec
from tests.spark.helpers import executed_plan

pytestmark = pytest.mark.spark

SPEC = GeneratorSpec(fronts=2, rate=200.0)
KEY = FIXED_PLAN_CONFS[0][0]


def unchanged(b: pa.RecordBatch) -> pa.RecordBatch:
    return b


def tracked_plan(spark: Any, *by: str) -> str:
    with lowtide.Pipeline(spark, "fixed", stuck_after_ms=600_000) as pipe:
        stream = pipe.generate(SPEC).repartition(2, *by).map(
            unchanged, UNTRACKED_SCHEMA, name="m")
        query = stream.to_null(checkpoint=tempfile.mkdtemp())
        try:
            return executed_plan(query.query)
        finally:
            query.stop()


def test_a_tracked_query_runs_a_fixed_plan_where_spark_would_adapt(spark) -> None:
    register_sources(spark)
    df = (spark.readStream.format("lowtide_gen").option("tracking", "false")
          .option("spec", SPEC.to_json()).load().repartition(2))
    query = df.writeStream.format("noop").option("checkpointLocation",
                                                 tempfile.mkdtemp()).start()
    try:
        assert "AdaptiveSparkPlan" in executed_plan(query)  # Spark's default
    finally:
        query.stop()
    assert "AdaptiveSparkPlan" not in tracked_plan(spark)
    assert spark.conf.get(KEY, None) is None  # set only while the query started


def test_a_session_that_turns_adaptive_execution_on_keeps_it(spark) -> None:
    spark.conf.set(KEY, "true")
    try:
        assert "AdaptiveSparkPlan" in tracked_plan(spark)
        assert spark.conf.get(KEY) == "true"
    finally:
        spark.conf.unset(KEY)


def test_a_tracked_repartition_hashes_the_tracking_column_instead_of_sorting(spark) -> None:
    """Spark's round robin sorts every row's bytes first, to be the same on a retry;
    the random tracking column spreads rows as evenly, the same on a retry, unsorted."""
    plan = tracked_plan(spark)
    assert "hashpartitioning(lt_track" in plan
    assert "RoundRobinPartitioning" not in plan and "Sort " not in plan
    assert "hashpartitioning(front" in tracked_plan(spark, "front")  # the user's columns
