"""``onWindowLate`` (issue 34 point 7): a FreshnessListener calls it once for every
sink window that became later than the pipeline's SLA, naming what held it, from the
tracker's status (a real tracker; the query is a stand-in: no Spark needed)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, TrackerService
from lowtide.spark.pipeline import FreshnessListener, PipelineShapeError, WindowLate, status_of
from lowtide.spark.pipeline.handle import operating_options

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))


class Late(FreshnessListener):
    def __init__(self, query: object) -> None:
        super().__init__(query)
        self.events: list[WindowLate] = []

    def onWindowLate(self, event: WindowLate) -> None:
        self.events.append(event)


def test_each_late_window_is_one_event_naming_what_holds_it() -> None:
    svc = TrackerService.start(GRAPH, sla_ms=200, sla_window_ms=100, metrics_every_ms=50)
    agent = Agent.connect(svc.url, GRAPH)
    try:
        agent.register_front(1, "src", int(time.time() * 100))  # then lags: it says nothing
        pipeline = SimpleNamespace(grid=TimeGrid(), tracker=SimpleNamespace(status=agent.status))
        listener = Late(SimpleNamespace(id="q-1", sink="sink", pipeline=pipeline))
        deadline = time.monotonic() + 10
        while len(listener.events) < 2 and time.monotonic() < deadline:
            listener.check()  # what Spark's progress events do
            time.sleep(0.1)
        first, second = listener.events[:2]
        assert (first.query_id, first.sink, first.end_ms - first.start_ms) == ("q-1", "sink", 100)
        assert second.start_ms > first.start_ms  # each window once
        assert first.late_ms > 0 and first.held_by.startswith("front 1 on 'src'")
        assert first.text.startswith("sink 'sink' window [")
        status = status_of(agent.status(), TimeGrid())  # what pipe.status() prints
        late = [line for line in status.render(10).splitlines() if line.startswith("LATE: ")]
        assert late and all(" later than its SLA (0.2 s): held by front 1" in line
                            for line in late)
    finally:
        agent.close()
        svc.stop()


@pytest.mark.parametrize(("kwargs", "what"), [
    ({"sla": "0 seconds"}, "sla"), ({"dead_fronts": "forget"}, "use 'wait' or 'retire'"),
    ({"front_timeout": "soon"}, "front_timeout"),
])
def test_bad_operating_options_are_refused_where_the_pipeline_is_described(
    kwargs: dict[str, str], what: str,
) -> None:
    options = {"front_timeout": None, "dead_fronts": "wait", "sla": None,
               "sla_window": "1 second", **kwargs}
    with pytest.raises(PipelineShapeError, match=what):
        operating_options(**options)  # type: ignore[arg-type]
