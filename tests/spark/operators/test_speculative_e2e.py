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
from lowtide.spark.sinks.changelog import apply_changelog, finals
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import fail_once, t0_of_checkpoint
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


def fold_batches(frames: list[pd.DataFrame], slot_of: Any = start_slots, at: int = SIZE - 1,
                 cols: list[str] = AGG_COLS) -> dict[tuple[str, int], tuple[int, bool]]:
    """Fold the changelog batch by batch as a reader would, checking it (each row at
    ``at`` past the slot ``slot_of`` gives it, one row per version); after each batch,
    :func:`apply_changelog` on the rows so far keeps exactly the latest version of
    each. Returns (user, slot) -> (latest version, is final)."""
    latest: dict[tuple[str, int], tuple[int, bool, tuple[Any, ...]]] = {}
    seen: list[pd.DataFrame] = []
    for rows in frames:
        if not len(rows):
            continue
        seen.append(rows)
        rows = rows.assign(start=slot_of(rows))
        assert (rows["lt_time"] == rows["start"] + at).all(), "not at the hold's slot"
        # a version's insert, its tombstone, the next version
        for r in rows.sort_values(["version", "op"]).to_dict("records"):
            key, values = (r["user"], r["start"]), tuple(r[c] for c in cols)
            have = latest.get(key)
            assert have is None or not have[1], f"a version after the final: {key}"
            if r["op"] == "tombstone":
                assert have is not None and have[0] == r["version"] and have[2] == values
                latest[key] = (have[0], False, ())  # cancelled: the next insert follows
            else:
                assert r["version"] == (have[0] + 1 if have else 1), f"a version skipped {key}"
                latest[key] = (r["version"], bool(r["is_final"]), values)
        folded = apply_changelog(pd.concat(seen, ignore_index=True))
        assert sorted(zip(folded["user"], slot_of(folded), folded["version"], strict=True)) \
            == sorted((u, s, v) for (u, s), (v, _, vals) in latest.items() if vals)
    return {k: (v, f) for k, (v, f, _) in latest.items()}


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


def check_changelog(frames: list[pd.DataFrame], spec: GeneratorSpec, t0: int, final: int
                    ) -> dict[tuple[str, int], tuple[int, bool]]:
    """The changelog's batches fold (:func:`fold_batches`) with a final for every
    window complete at ``final``, some version replaced, and finals equal to a batch
    recomputation; the fold."""
    latest = fold_batches(frames)
    rows = pd.concat(frames, ignore_index=True)
    assert (rows["op"] == "tombstone").sum() > 0, "no early version was ever replaced"
    done = {k for k in latest if k[1] + SIZE <= final}
    assert done and all(latest[k][1] for k in done), "a complete window without its final"
    exact = finals(rows)
    horizon = max(final, int(start_slots(exact).max()) + SIZE)
    check(exact, batch_windows(all_input(spec, t0, horizon), SIZE, SIZE), horizon, SIZE,
          AGG_COLS)
    assert len(exact) == sum(f for _, f in latest.values())
    return latest


def state_operators(query: Any) -> list[str]:
    """The stateful operators of a query's last micro-batch."""
    progress = query.query.lastProgress
    return [op["operatorName"] for op in progress["stateOperators"]]


def run_changelog(stream: Any, sink: Any, ckpt: Path, lag_ms: int, restart_at: int = 0,
                  past: int = 3 * SIZE, operators: int = 2) -> tuple[int, int]:
    """Write ``stream``'s changelog to ``sink`` (``foreach_batch``) until the sink is
    ``past`` slots past the lag (three windows); ``restart_at``: stopped once the sink
    is that many slots past t0 (with ``operators`` state operators: Spark's aggregation
    and the changelog's step) and started again from the checkpoint. (t0, the sink's
    last min time)."""

    def start() -> Any:
        return stream.foreach_batch(sink, checkpoint=str(ckpt), keep_tracking_columns=True,
                                    trigger="200 milliseconds")

    query = start()
    t0 = t0_of_checkpoint(ckpt, query)
    if restart_at:
        query.wait_for_min_time(GRID.slot_of(t0) + restart_at, timeout_s=300)
        assert len(state_operators(query)) == operators, state_operators(query)
        query.stop()  # windows with versions shown stay in both state stores
        query = start()
    query.wait_for_min_time(GRID.slot_of(t0 + lag_ms) + past, timeout_s=300)
    assert not query.stuck()
    query.stop()
    return t0, query.min_time()


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
    latest = fold_batches([rows])
    assert all(f for (_, start), (_, f) in latest.items() if start + SIZE <= final)
    changes = spark.read.parquet(str(tmp_path / "out"))
    exact = apply_changelog(changes).where("is_final").toPandas()
    assert len(exact) == sum(f for _, f in latest.values())
    horizon = max(final, int(start_slots(exact).max()) + SIZE)
    check(exact, batch_windows(all_input(spec, t0, horizon), SIZE, SIZE), horizon, SIZE,
          AGG_COLS)


class ByBatch:
    """A ``foreach_batch`` function that keeps each batch's rows by batch id, as an
    idempotent sink does, and records any batch run again with other rows (each
    batch's rows in the order of ``cols``, its changelog's identity)."""

    def __init__(self, cols: tuple[str, ...] = ("user", "window_start", "version", "op")
                 ) -> None:
        self.cols = list(cols)
        self.batches: dict[int, pd.DataFrame] = {}
        self.rerun_differs: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.toPandas().sort_values(self.cols).reset_index(drop=True)
        with self._lock:
            before = self.batches.get(batch_id)
            if before is not None and not before.equals(rows):
                self.rerun_differs.append(batch_id)
            self.batches[batch_id] = rows


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
    """Spark's aggregation under the changelog's keyed step where its exact window
    would be planned in the JVM; the keyed runtime alone for a sink that takes no
    update mode (write_parquet, write_table) and without a checkpoint."""
    pipe = lowtide.Pipeline(spark, "which-spec", grid=GRID)
    changes = (pipe.generate(GeneratorSpec(fronts=1, rate=10.0, payload_bytes=4))
               .map(parse, SCHEMA, name="parse").window("1 second", key="user", name="w")
               .agg(n="count").speculative())

    def plan(stream: Any, checkpoint: str | None) -> str:
        df = pipe.build(stream, checkpoint=checkpoint).df
        return str(df._jdf.queryExecution().analyzed().toString())

    try:
        jvm = plan(changes, str(tmp_path / "a"))
        assert "Aggregate" in jvm and "TransformWithState" in jvm
        for keyed in (plan(on_keyed_runtime(changes), str(tmp_path / "b")),
                      plan(changes, None)):
            assert "TransformWithState" in keyed and "Aggregate" not in keyed
    finally:
        pipe.close()
