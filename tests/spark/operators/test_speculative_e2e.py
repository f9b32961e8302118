"""End to end, speculative windows (rule 13): under a lagging front and injected task
failures, and across a restart from the checkpoint, the changelog folded after every
batch is the latest version of each window (tombstones cancel the version they name,
versions follow each other, nothing follows a final), every row sits at its window's
last slot, and the finals equal a batch recomputation."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.operators import on_keyed_runtime
from lowtide.spark.operators.speculative_plan import bucket_labels
from lowtide.spark.pipeline import last_batch_id
from lowtide.spark.sinks.changelog import apply_changelog
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
from tests.spark.operators.changelogs import (
    ByBatch,
    check_changelog,
    fold_batches,
    run_changelog,
)
from tests.spark.operators.helpers import (
    AGG_COLS,
    GRID,
    SCHEMA,
    STUCK_MS,
    all_input,
    batch_windows,
    check,
    parse,
    run_timed,
    start_slots,
)

pytestmark = pytest.mark.spark
SIZE = 100  # slots: 1 second


class Batches:
    """A ``foreach_batch`` function that keeps each batch's changelog rows, in order."""

    def __init__(self) -> None:
        self.frames: list[pd.DataFrame] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.toPandas()
        with self._lock:
            self.frames.append(rows)


def failing_window(pipe: Any, spec: GeneratorSpec) -> Any:
    """A speculative window whose sender tasks and changelog tasks fail once now and
    then (the changelog's after its rows were sent)."""
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    after = fail_once(lambda b, p: b % 4 == 2)
    return (pipe.generate(spec).map(parse, SCHEMA, name="parse")
            .transform(lambda df: df.mapInArrow(before, df.schema))
            .window("1 second", key="user", name="win")
            .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                 hi=("amount", "max"), avg=("amount", "mean"))
            .speculative()
            .transform(lambda df: df.mapInArrow(after, df.schema)))


@pytest.mark.slow  # ~18 s; failures and a restart by default: test_the_jvm_plan_under_...
def test_early_rows_then_finals_under_a_lagging_front_and_task_failures(
        spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=3, rate=240.0, payload_bytes=4, lag_ms={2: 1500})
    pipe = lowtide.Pipeline(spark, "spec-lag", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = failing_window(pipe, spec)
    assert stream.segment_names() == ["parse", "win", "win.state", "sink"]
    sink = Batches()
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 1500)
    finally:
        pipe.close()
    check_changelog(sink.frames, spec, t0, final)


@pytest.mark.slow  # ~14 s; a restart by default: test_the_jvm_plan_under_task_failures_...
def test_a_restart_neither_repeats_nor_skips_a_version(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 600})
    pipe = lowtide.Pipeline(spark, "spec-restart", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .speculative(every="300 milliseconds"))
    rows, t0, final = run_timed(pipe, stream, tmp_path, 250, restart_at=120)
    ident = rows.assign(start=start_slots(rows))[["user", "start", "version", "op"]]
    assert not ident.duplicated().any(), "a version written twice"
    latest = fold_batches([rows], start_slots, SIZE - 1, AGG_COLS)
    assert all(f for (_, start), (_, f) in latest.items() if start + SIZE <= final)
    changes = spark.read.parquet(str(tmp_path / "out"))
    exact = apply_changelog(changes).where("is_final").toPandas()
    assert len(exact) == sum(f for _, f in latest.values())
    horizon = max(final, int(start_slots(exact).max()) + SIZE)
    check(exact, batch_windows(all_input(spec, t0, horizon), SIZE, SIZE), horizon, SIZE,
          AGG_COLS)


@pytest.mark.slow  # ~46 s; the same faults by default on the driver's changelog step:
# test_the_changelog_step_on_the_driver_under_failures_and_restarts
def test_the_jvm_plan_under_task_failures_and_a_restart(spark, tmp_path: Path) -> None:
    """The plan over Spark's aggregation (its state operators: Spark's aggregation and
    the changelog's keyed step), with a sender task and a changelog task failing once
    each, stopped and restarted from its checkpoint: no version is written twice or
    skipped, a batch run again emits the same rows, the changelog folds to the finals
    and the finals equal a batch recomputation."""
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 600})
    pipe = lowtide.Pipeline(spark, "spec-jvm", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = failing_window(pipe, spec)
    sink = ByBatch()
    try:
        t0, final = run_changelog(stream, sink, tmp_path / "ckpt", 600, restart_at=150)
    finally:
        pipe.close()
    assert not sink.rerun_differs, f"batches run again with other rows: {sink.rerun_differs}"
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    rows = pd.concat(frames, ignore_index=True)
    ident = rows.assign(start=start_slots(rows))[["user", "start", "version", "op"]]
    assert not ident.duplicated().any(), "a version written twice"
    check_changelog(frames, spec, t0, final)


def test_each_bucket_of_the_changelog_step_has_a_task_of_its_own(spark) -> None:
    """The changelog step's buckets, named by :func:`bucket_labels`, land in distinct
    partitions of Spark's hash partitioning (bare bucket numbers 0 and 1 both land in
    partition 1 of 2): one group per task and micro-batch."""
    from pyspark.sql import functions as F

    bare = spark.createDataFrame([(0,), (1,)], "g long").repartition(2, "g")
    assert bare.select(F.spark_partition_id()).distinct().count() == 1
    for n in (2, 3, 8):
        labels = bucket_labels(spark, n)
        df = spark.createDataFrame([(b,) for b in labels], "g long").repartition(n, "g")
        got = {r["g"]: r["p"] for r in df.select("g", F.spark_partition_id().alias("p"))
               .collect()}
        assert [got[b] for b in labels] == list(range(n))


def test_which_plan_a_speculative_window_gets(spark, tmp_path: Path) -> None:
    """Spark's aggregation where its exact window would be planned in the JVM
    (whatever the sink: each is a foreachBatch function, which takes update mode),
    with the changelog step on the driver where the window is the last step of a
    query (its sink runs the step), else under the changelog's keyed step: a step after
    the window, a build for a caller's own sink, a checkpoint that ran the keyed step.
    The keyed runtime alone when asked for (``on_keyed_runtime``, the bench's variant)
    and without a checkpoint."""
    pipe = lowtide.Pipeline(spark, "which-spec", grid=GRID)
    changes = (pipe.generate(GeneratorSpec(fronts=1, rate=10.0, payload_bytes=4))
               .map(parse, SCHEMA, name="parse").window("1 second", key="user", name="w")
               .agg(n="count").speculative())

    def plan(stream: Any, checkpoint: str | None, on_driver: bool = False) -> str:
        built = pipe.build(stream, checkpoint=checkpoint, changelog_on_driver=on_driver)
        text = str(built.df._jdf.queryExecution().analyzed().toString())
        assert (built.changelog is not None) == ("TransformWithState" not in text)
        return text

    try:
        driver = plan(changes, str(tmp_path / "d"), on_driver=True)
        assert "Aggregate" in driver and "TransformWithState" not in driver
        ran = tmp_path / "ran" / "offsets"
        ran.mkdir(parents=True)
        (ran / "0").write_text("v1\n{}\n")
        after = changes.transform(lambda df: df, name="after")
        for jvm in (plan(changes, str(tmp_path / "a")),
                    plan(changes, str(tmp_path / "ran"), on_driver=True),
                    plan(after, str(tmp_path / "c"), on_driver=True)):
            assert "Aggregate" in jvm and "TransformWithState" in jvm
        for keyed in (plan(on_keyed_runtime(changes), str(tmp_path / "b"), on_driver=True),
                      plan(changes, None)):
            assert "TransformWithState" in keyed and "Aggregate" not in keyed
    finally:
        pipe.close()


@pytest.mark.slow  # ~11 s; what it guards is a cost, not a result
def test_the_changelog_step_declares_no_row_parts(spark, tmp_path: Path) -> None:
    """The changelog step over Spark's aggregation keeps one record per bucket and no
    row parts: its tasks declare one state variable (a map state declared too cost a
    round trip to the JVM per task and batch), and a batch still emits versions. (A
    step after the window keeps the changelog step off the driver.)"""
    pipe = lowtide.Pipeline(spark, "spec-vars", grid=GRID, stuck_after_ms=STUCK_MS)
    changes = (pipe.generate(GeneratorSpec(fronts=1, rate=200.0, payload_bytes=4))
               .map(parse, SCHEMA, name="parse").window("1 second", key="user", name="w")
               .agg(n="count").speculative().transform(lambda df: df, name="after"))
    sink = Batches()
    query = changes.foreach_batch(sink, checkpoint=str(tmp_path / "ckpt"),
                                  trigger="200 milliseconds")
    try:
        # a batch that ran the step's tasks, after the one whose rows reached the sink
        while not any(len(f) for f in sink.frames) or last_batch_id(query.query) < 2:
            assert query.query.exception() is None, query.query.exception()
            query.query.awaitTermination(0.2)
        ops = {op["operatorName"]: op["customMetrics"]
               for op in query.query.lastProgress["stateOperators"]}
    finally:
        query.stop()
        pipe.close()
    step = ops["transformWithStateInPandasExec"]
    assert step["numValueStateVars"] > 0
    assert step["numMapStateVars"] == 0, step


class FailsOnce(ByBatch):
    """:class:`ByBatch` that raises once, after keeping batch ``at``'s rows: the query
    fails after the driver's changelog step sent that batch's acks, before its commit."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.failed = at, False

    def __call__(self, df: Any, batch_id: int) -> None:
        super().__call__(df, batch_id)
        if batch_id >= self.at and not self.failed:
            self.failed = True
            raise RuntimeError("injected sink failure")


def test_the_changelog_step_on_the_driver_under_failures_and_restarts(
        spark, tmp_path: Path) -> None:
    """A speculative window as the query's last step: Spark's aggregation is its one
    state operator, the changelog is computed in the sink's ``foreachBatch``. A sender
    task fails once; the sink fails once after the step sent a batch's acks, and the
    query is started again from its checkpoint; later it is stopped and started once
    more. The batch that failed is run again with the same rows, no version is written
    twice or skipped, the changelog folds to the finals and the finals equal a batch
    recomputation."""
    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 600})
    pipe = lowtide.Pipeline(spark, "spec-driver", grid=GRID, stuck_after_ms=STUCK_MS)
    before = fail_once(lambda b, p: b % 5 == 3 and p == 0)
    stream = (pipe.generate(spec).map(parse, SCHEMA, name="parse")
              .transform(lambda df: df.mapInArrow(before, df.schema))
              .window("1 second", key="user", name="win")
              .agg(n="count", total=("amount", "sum"), lo=("amount", "min"),
                   hi=("amount", "max"), avg=("amount", "mean"))
              .speculative())
    sink, ckpt = FailsOnce(at=8), tmp_path / "ckpt"
    try:
        query = stream.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                     trigger="200 milliseconds")
        t0 = t0_of_checkpoint(ckpt, query)
        with pytest.raises(Exception, match="injected sink failure"):
            query.awaitTermination(timeout=300)
        failed = max(sink.batches)
        # restarted: stopped and restarted again a second of windows past the failure
        restart_at = query.min_time() - GRID.slot_of(t0) + 100
        t0_again, final = run_changelog(stream, sink, ckpt, 600, restart_at=restart_at,
                                        operators=1)
        assert t0_again == t0
    finally:
        pipe.close()
    assert failed in sink.batches and not sink.rerun_differs, sink.rerun_differs
    assert (ckpt / "lowtide" / "changelog-win").is_dir()
    frames = [sink.batches[b] for b in sorted(sink.batches)]
    rows = pd.concat(frames, ignore_index=True)
    ident = rows.assign(start=start_slots(rows))[["user", "start", "version", "op"]]
    assert not ident.duplicated().any(), "a version written twice"
    check_changelog(frames, spec, t0, final)
