"""Progress in Spark's own tools: a tracked query's ``lastProgress`` carries lowtide's
figures as observed metrics, and a ``CompletenessListener`` receives window-complete
events and, for a row an untracked step loses, a segment-stuck event."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from lowtide.core.time import TimeGrid
from lowtide.service import TrackerService, wall_ms
from lowtide.spark.pipeline import Pipeline, TrackedQuery
from lowtide.spark.pipeline.monitoring import (
    METRICS_NAME,
    CompletenessListener,
    ProgressMetrics,
    SegmentStuck,
    WindowComplete,
)
from lowtide.spark.pipeline.progress_delivery import FIGURES_KEY, figures_map, figures_text
from lowtide.spark.sources.generator import GeneratorSpec
from lowtide.spark.tracking.transport import TrackerRef
from tests.service import lost

pytestmark = pytest.mark.spark

RATE_PER_FRONT = 100.0
LOST_SEQ = 300  # front 0's row 300: 3 s after t0, so windows complete before it
WINDOW_MS = 1_000
GRID = TimeGrid(10)
SLOT = 1_000  # the stuck window's slot


def same(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "seq": b["seq"]})


class Recorder(CompletenessListener):
    def __init__(self, query: TrackedQuery, since_ms: int) -> None:
        super().__init__(query, window_ms=WINDOW_MS, since_ms=since_ms)
        self.windows: list[WindowComplete] = []
        self.stuck: list[SegmentStuck] = []
        self.got_stuck = threading.Event()

    def onWindowComplete(self, event: WindowComplete) -> None:
        self.windows.append(event)

    def onSegmentStuck(self, event: SegmentStuck) -> None:
        self.stuck.append(event)
        self.got_stuck.set()


def test_progress_and_listener_events(spark, tmp_path: Path) -> None:
    t0 = wall_ms()
    pipe = Pipeline(spark, "monitored", grid=TimeGrid(10), stuck_after_ms=1_000)
    spec = GeneratorSpec(fronts=2, rate=2 * RATE_PER_FRONT, payload_bytes=4, t0_ms=t0)
    stream = (pipe.generate(spec).map(same, "front int, seq long", name="parse")
              .transform(lambda df: df.where(f"NOT (front = 0 AND seq = {LOST_SEQ})"))
              .map(same, "front int, seq long", name="keep"))
    built = pipe.build(stream, "sink", null_sink=True)
    metrics = ProgressMetrics.of(built.ref, "sink")
    spark_query = (metrics.observe(built.df).writeStream.format("noop")
                   .option("checkpointLocation", str(tmp_path / "ckpt"))
                   .trigger(processingTime="300 milliseconds").start())
    query = TrackedQuery(pipe, spark_query, built.graph, "sink")
    listener = Recorder(query, since_ms=t0)
    spark.streams.addListener(listener)
    try:
        assert listener.got_stuck.wait(180), f"no stuck event; windows {listener.windows}"
        figures = wait_for_stuck_in_progress(spark_query)
    finally:
        spark.streams.removeListener(listener)
        query.stop()
        pipe.close()

    # the observed metrics: the tracker's figures while the batch ran
    assert set(figures) == set(metrics.figures())
    assert 0 < figures["sink_min_time"] <= figures["min_time.parse"]
    assert figures["min_time.keep"] <= figures["min_time.parse"]
    assert figures["sink_lag_ms"] > 0
    # the lost row holds 'keep' (and the sink) back at its window
    lost_slot = pipe.grid.slot_of(t0 + int(LOST_SEQ * 1000 / RATE_PER_FRONT))
    assert figures["min_time.keep"] <= lost_slot

    # exactly one stuck window, in 'keep', the lost row's, one row missing
    assert len(listener.stuck) == 1
    stuck = listener.stuck[0]
    assert stuck.segment == "keep" and stuck.what == "1 item(s) missing"
    assert stuck.start_slot <= lost_slot < stuck.end_slot
    assert stuck.query_id == query.id

    # windows completed once each, in order, from t0's window up to the lost row's
    starts = [w.start_ms for w in listener.windows]
    assert starts, "no window-complete event"
    assert starts[0] == t0 // WINDOW_MS * WINDOW_MS
    assert starts == list(range(starts[0], starts[0] + WINDOW_MS * len(starts), WINDOW_MS))
    assert all(w.segment == "sink" and w.end_ms - w.start_ms == WINDOW_MS
               for w in listener.windows)
    assert listener.windows[-1].end_ms <= pipe.grid.slot_start_ms(lost_slot + 1)


def wait_for_stuck_in_progress(query, timeout_s: float = 60.0) -> dict[str, int]:
    """The first progress whose observed metrics show the stuck window."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = ((query.lastProgress or {}).get("observedMetrics") or {}).get(METRICS_NAME)
        figures = row.asDict() if row is not None else {}
        if figures.get("stuck_windows"):
            return figures
        time.sleep(0.3)
    raise AssertionError(f"no progress showed the stuck window: {query.lastProgress}")


def test_the_figures_come_from_the_tracker_through_the_driver(spark) -> None:
    """The figures the driver's publisher got from the tracker, in a batch
    DataFrame's observation: min times, the stuck window and each front's late
    records (issue 33 point 8)."""
    from pyspark.sql import Observation

    svc = TrackerService.start(lost.graph(), grid=GRID, stuck_after_ms=100)
    try:
        with svc.agent() as agent:
            lost.lose_items(agent, SLOT)
            agent.report_late(lost.FRONT, (12, 3, 0, 1))
        deadline = time.monotonic() + 30
        while not svc.status().get("stuck"):
            assert time.monotonic() < deadline, "no stuck window"
            time.sleep(0.05)
        metrics = ProgressMetrics(TrackerRef(svc.url, lost.graph(), GRID), "sink")
        tracker = SimpleNamespace(status=svc.status, grid=GRID, graph=lost.graph())
        metrics.build(SimpleNamespace(tracker=tracker, spark=spark)).publish()
        # one entry, every figure in it: a publication is one Py4J call, not one a figure
        assert list(figures_map(metrics, spark).keySet()) == [FIGURES_KEY]
        seen = Observation("lowtide")
        df = spark.createDataFrame([(t,) for t in range(300)], "lt_track long").repartition(3)
        assert metrics.observe(df, seen).count() == 300
        figures = seen.get
    finally:
        svc.stop()
    assert figures["min_time.parse"] == SLOT and figures["min_time.src"] == SLOT + 10
    assert figures["sink_min_time"] == figures["global_min_time"] == SLOT
    assert figures["stuck_windows"] == 1 and figures["sink_lag_ms"] > 0
    assert (figures["late_clamped"], figures["late_rejected"]) == (12, 3)
    assert json.loads(figures["late"]) == {str(lost.FRONT): {
        "late_clamped": 12, "late_rejected": 3, "late_raised": 0, "out_of_range": 1}}


def test_figures_nobody_published_are_null(spark) -> None:
    """Before the first publication, a figure is null and the batch goes on."""
    from pyspark.sql import Observation

    ref = TrackerRef("tcp://127.0.0.1:1", lost.graph(), GRID)
    metrics = ProgressMetrics(ref, "nobody")
    seen = Observation("lowtide")
    assert metrics.observe(spark.range(3), seen).count() == 3
    assert seen.get == dict.fromkeys(metrics.figures())


def test_the_rows_pay_nothing_for_the_figures(spark) -> None:
    """The metrics hold no aggregate and read nothing per row: each is its figure's
    element of the one text in the driver's map, evaluated where Spark computes the
    metrics; a figure published after the query was planned shows in its next
    observation."""
    from pyspark.sql import Observation

    ref = TrackerRef("tcp://127.0.0.1:1", lost.graph(), GRID)
    metrics = ProgressMetrics(ref, "lookups")
    figures = figures_map(metrics, spark)
    seen = [Observation("lowtide") for _ in range(2)]
    observed = [metrics.observe(spark.range(0, 1000, 1, 4), s) for s in seen]
    plan = observed[0]._jdf.queryExecution().analyzed().toString()
    assert "CollectMetrics" in plan
    assert not any(f in plan for f in ("max(", "max_by(", "reflect(", "java_method("))
    try:
        for run, value in enumerate((7, 8)):
            figures.put(FIGURES_KEY, figures_text(metrics.figures(),
                                                  {"sink_min_time": value, "late": "{}"}))
            assert observed[run].count() == 1000
            got = seen[run].get
            assert got["sink_min_time"] == value and got["late"] == "{}"
            assert got["global_min_time"] is None  # not published
    finally:
        figures.clear()


def test_each_figure_is_one_lookup_and_a_cast(spark) -> None:
    """A figure's expressions are planned, and evaluated on the driver as each task
    ends, in every micro-batch: a number is its element of the text cast (a JSON null
    casts to null), and only the one text figure tells a JSON null from a value
    (before: every figure had its own null test, which cost the window query 5-11 ms of
    CPU a micro-batch, BENCHMARKS.md)."""
    ref = TrackerRef("tcp://127.0.0.1:1", lost.graph(), GRID)
    metrics = ProgressMetrics(ref, "plan")
    plan = metrics.observe(spark.range(3))._jdf.queryExecution().analyzed().toString()
    # each figure's element once, the text figure's twice (its null test)
    assert plan.count("get_json_object") == len(metrics.figures()) + 1
    assert plan.upper().count("CASE WHEN") == 1
