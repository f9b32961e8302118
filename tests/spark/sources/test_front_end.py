"""Issue 33 points 8 and 9 at the front, without Spark.

Point 9, the end of a stream: ``close()`` completes everything the front sent (its last
heartbeat is the end of its input, so the windows holding its newest records can
complete); when every front of a segment ended, every window does, whether the fronts
stay registered or unregister; ``close(end=False)`` is a pause that still passes every
record labelled (before, a clock front's close promised the slot of its last records,
leaving that slot open); a successor of an ended front is refused; a segment whose
fronts were unregistered below the end shows in status as open, with nothing to close it.

Point 8, where late records went: a front reports its clamped, rejected, raised and
out-of-range counts to the tracker, whose status (and `lowtide status`), web view and
Prometheus metrics show them, as does a pipeline's progress (``PipelineStatus``).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import ManualClock, TimeGrid
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.client.status import render
from lowtide.service.clock import wall_ms
from lowtide.service.engine.front_events import FrontEvents
from lowtide.service.progress import open_ends
from lowtide.service.server.metrics import ServerMetrics
from lowtide.service.web.view import utc_slots, view_document
from lowtide.spark.pipeline.status import status_of
from lowtide.spark.sources.front import Front, FrontEnded
from lowtide.spark.sources.labels import from_label
from lowtide.spark.tracking import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, connect
from lowtide.wire.messages import FrontLate
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import wait_for_min

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
T0 = 1_000_000  # ms: slot 100_000


def receive(agent: CoreAgent, times: np.ndarray, labels: np.ndarray, key: int) -> None:
    """The consumer's receipt of ``src``'s records."""
    acc = AckAccumulator()
    acc.add(GRAPH.index("src"), np.asarray(times), from_label(labels), -1)
    agent.send_batch(("consumer", key, "src", 0), acc.build(GRID.window_slots))


def clock_front(agent: CoreAgent, front: int, clock: ManualClock) -> Front:
    return Front(None, front, agent, segment="src", grid=GRID, clock=clock, heartbeat_ms=None)


def sent(agent: CoreAgent, front: Front, key: int) -> int:
    """Label two records at the front's clock, write and receive them; their slot."""
    batch = front.label([b"a", b"b"])
    front.written(batch)
    receive(agent, batch.times, batch.acks, key)
    return int(batch.times.max())


# ------------------------------------------------------------------ point 9


def test_close_completes_the_slot_of_a_clock_fronts_last_records() -> None:
    """Records labelled at the clock's slot s: closing then promised s (the old close),
    so slot s stayed open. A pause now promises s + 1; the end, the end of time."""
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    paused = clock_front(agent, 1, clock)
    s = sent(agent, paused, 0)
    assert paused.close(end=False) == s + 1
    assert agent.step()["src"] == s + 1  # every record it labelled is complete

    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    ended = clock_front(agent, 1, clock)
    sent(agent, ended, 0)
    assert ended.close() == GRID.end_slot
    assert GRID.at_end(agent.step()["src"])  # every window of its records can complete


def test_an_input_ends_when_every_front_ended_registered_or_not() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    a, b = clock_front(agent, 1, clock), clock_front(agent, 2, clock)
    s = sent(agent, a, 0)
    sent(agent, b, 1)
    clock.advance(50)
    a.close()  # one front ended: the other one still holds the segment
    assert agent.step()["src"] == s
    b.close(unregister=True)  # the other ends and leaves: its end stays (done bound)
    assert GRID.at_end(agent.step()["src"])


def test_every_clock_front_unregistering_completes_their_last_window() -> None:
    """The issue's case: clock fronts closing with unregister=True left the segment at
    their last heartbeat, the slot of their last records, for good."""
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    fronts = [clock_front(agent, f, clock) for f in (1, 2)]
    for key, f in enumerate(fronts):
        sent(agent, f, key)
    for f in fronts:
        f.close(unregister=True)
    assert GRID.at_end(agent.step()["src"])


def test_close_never_promises_past_a_batch_not_yet_written() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = clock_front(agent, 1, clock)
    lost = front.label([b"x"])  # acked, never written: the producer dies
    assert front.close() == int(lost.times.min())
    assert agent.step()["src"] == int(lost.times.min())


def test_a_block_that_raises_pauses_its_front_and_a_successor_resumes() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    with pytest.raises(RuntimeError), clock_front(agent, 1, clock) as front:
        s = sent(agent, front, 0)
        raise RuntimeError("the producer failed")
    assert agent.step()["src"] == s + 1  # a pause, not the end
    clock.advance(100)
    successor = clock_front(agent, 1, clock)
    assert successor.heartbeat() == s + 10  # resumed at its clock


@pytest.fixture
def service() -> Iterator[TrackerService]:
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        yield svc
        connect(TrackerRef(svc.url, GRAPH, GRID)).close()  # the fronts' agent, before the stop


@pytest.mark.socket
def test_a_successor_of_an_ended_front_is_refused(service: TrackerService) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    Front(None, 1, ref, segment="src", heartbeat_ms=None, owner="p").close()
    with pytest.raises(FrontEnded, match=r"close\(end=False\)"):
        Front(None, 1, ref, segment="src", heartbeat_ms=None, owner="p")


@pytest.mark.socket
def test_status_shows_a_segment_no_live_front_will_close(service: TrackerService) -> None:
    """Fronts unregistered after a pause: the segment stays where they were, and the
    windows holding their last records (here: an item held in the sink) never complete
    and are not stuck. Status says so, in each view; an ended input shows nothing."""
    ref = TrackerRef(service.url, GRAPH, GRID)
    with Agent.connect(service.url, GRAPH) as consumer:
        front = Front(None, 1, ref, segment="src", heartbeat_ms=None)
        batch = front.label([b"a"])
        front.written(batch)
        acc = AckAccumulator()  # received from src, sent into sink: a held window
        acc.add(GRAPH.index("sink"), batch.times, from_label(batch.acks) ^ 1, +1)
        acc.add(GRAPH.index("src"), batch.times, from_label(batch.acks), -1)
        consumer.send_batch(BatchKey("window", 0, "src", 0), acc.build(1))
        last = front.close(end=False, unregister=True)
        wait_for_min(consumer, 0, last - 1)
        doc = service.status()
        [line] = open_ends(doc)
        assert f"segment 'src' has no live front: it stays at slot {last}" in line
        assert "1 item(s) held open downstream" in line
        assert status_of(doc, GRID).open_ends == [line]
        assert f"OPEN: {line}" in status_of(doc, GRID).render(GRID.delta_ms)
        assert view_document(doc, GRAPH)["open_ends"] == [utc_slots(line, GRID.delta_ms)]
        assert "open: segment 'src'" in text_of(render(doc))

        while GRID.slot_of(wall_ms()) < last:  # a new front starts at the paused promise
            time.sleep(0.002)
        ender = Front(None, 2, ref, segment="src", heartbeat_ms=None)
        ender.close(unregister=True)  # the input's end: no open end left
        wait_for_min(consumer, 0, GRID.end_slot - 1)
        assert open_ends(service.status()) == []


def text_of(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=300, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


# ------------------------------------------------------------------ point 8


@pytest.mark.socket
def test_late_counts_reach_the_trackers_status_views_and_metrics(
    service: TrackerService,
) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    frame = pd.DataFrame({"ts": pd.to_datetime([t0, t0 + 2_000], unit="ms")})
    late = pd.DataFrame({"ts": pd.to_datetime([t0 + 100, t0 + 200, t0 + 3_000], unit="ms")})
    clamp = Front(None, 1, ref, segment="src", time_from="ts", heartbeat_ms=5)
    reject = Front(None, 2, ref, segment="src", time_from="ts", late="reject", heartbeat_ms=5)
    for f in (clamp, reject):
        f.written(f.label(frame))
        time.sleep(0.05)  # a heartbeat passes the first batch
        f.written(f.label(late))
    expected = {"1": {"late_clamped": 2, "late_rejected": 0, "late_raised": 0,
                      "out_of_range": 0},
                "2": {"late_clamped": 0, "late_rejected": 2, "late_raised": 0,
                      "out_of_range": 0}}
    deadline = time.monotonic() + 10
    while service.status()["front_events"].get("late") != expected:
        assert time.monotonic() < deadline, service.status()["front_events"]
        time.sleep(0.02)
    for f in (clamp, reject):
        f.close(unregister=True)
    doc = service.status()
    assert doc["front_events"]["late"] == expected  # kept after the fronts left

    progress = status_of(doc, GRID)
    assert progress.late == expected
    assert ("front 1: late records: 2 clamped, 0 rejected, 0 raised; 0 out of range"
            in progress.render(GRID.delta_ms))
    assert "front 2: late records: 0 clamped, 2 rejected" in text_of(render(doc))
    assert view_document(doc, GRAPH)["late"][1] == {"front": 2, **expected["2"]}
    metrics = ServerMetrics()
    metrics.observe(doc, wall_ms(), GRID)
    text = metrics.render().decode()
    assert ('lowtide_front_late_records{front="1",outcome="late_clamped",pipeline="default"}'
            ' 2.0') in text


def test_late_counts_survive_a_snapshot() -> None:
    """The engine keeps them in its snapshot (a restarted tracker shows them before the
    front's next report); a resent older report changes nothing."""
    events = FrontEvents()
    events.report_late(FrontLate(2, 7, 3, 5, 1, 0, 0))
    events.report_late(FrontLate(1, 7, 3, 4, 0, 0, 0))  # an older resend: ignored
    again = FrontEvents()
    again.load(events.export())
    assert again.late == {"3": {"late_clamped": 5, "late_rejected": 1, "late_raised": 0,
                                "out_of_range": 0}}
