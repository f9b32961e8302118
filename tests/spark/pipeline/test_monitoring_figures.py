"""What the observed metrics and the listener's events say, from a tracker status
(no Spark session): figures per segment, the stuck line parsed back, the start-up
line of the status table."""

from __future__ import annotations

from lowtide.core.diagnostics import StuckWindow
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.spark.pipeline import PipelineStatus, ProgressMetrics, status_of
from lowtide.spark.pipeline.monitoring import _stuck_event

GRAPH = SegmentGraph.of(("parse", ()), ("keep", ("parse",)), ("sink", ("keep",)))
GRID = TimeGrid(10)


def doc(now_ms: int, stuck: list[str]) -> dict:
    return {"now_ms": now_ms, "global_min": 90, "stuck": stuck, "fronts": {},
            "segments": [{"segment": "parse", "min_time": 120},
                         {"segment": "keep", "min_time": 100},
                         {"segment": "sink", "min_time": 90}]}


def test_figures_of_a_status() -> None:
    metrics = ProgressMetrics.of("orders", GRAPH, "sink")
    status = status_of(doc(2_000, ["segment 'keep', slots [100, 101): 1 item(s) missing"]), GRID)
    assert metrics.values(status) == {
        "sink_min_time": 90, "global_min_time": 90, "sink_lag_ms": 2_000 - 90 * 10,
        "stuck_windows": 1, "min_time.parse": 120, "min_time.keep": 100, "min_time.sink": 90,
        "fronts_refused": 0, "fronts_waiting": 0}
    assert set(metrics.values(status)) == set(metrics.figures())
    assert metrics.property_of("sink_min_time") == "lowtide.orders.sink.sink_min_time"


def test_fronts_refused_and_waiting_show_at_the_consumer() -> None:
    """Issue 29 point 1: a producer that started late and was refused, or a declared
    one still awaited, is in the query's progress and the status table, not only in
    the producer's exception."""
    body = doc(2_000, [])
    body["fronts_declared"] = {"4": ["parse", 100, -1]}
    body["front_events"] = {"behind": 1, "retired": 0, "recent": [
        "refused: front 5 registers at 80, below its segment's min time 120: ..."]}
    status = status_of(body, GRID)
    figures = ProgressMetrics.of("orders", GRAPH, "sink").values(status)
    assert (figures["fronts_refused"], figures["fronts_waiting"]) == (1, 1)
    text = status.render(GRID.delta_ms)
    assert "front 4" in text and "declared, not registered: holds it at 100" in text
    assert "FRONTS REFUSED: 1" in text and "FRONT: refused: front 5 registers at 80" in text


def test_stuck_lines_parse_back_into_events() -> None:
    for count, what in ((1, "1 item(s) missing"), (-2, "2 extra item(s) (duplicates)")):
        text = StuckWindow("keep", 100, 101, count, xor=5, since_ms=0).describe()
        event = _stuck_event("q", text)
        assert (event.segment, event.start_slot, event.end_slot, event.what) == (
            "keep", 100, 101, what)
        assert event.text == text


def test_status_table_starts_with_the_start_up_phase() -> None:
    status = PipelineStatus(1_000, 0, [], starting="batch 0 running: 2/6 tasks done")
    assert status.render(10).splitlines()[0] == "starting: batch 0 running: 2/6 tasks done"
    assert not PipelineStatus(1_000, 0, []).render(10).startswith("starting")
