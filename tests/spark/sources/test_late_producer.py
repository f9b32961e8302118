"""Issue 29 points 1, 2 (two producers of one front) and 3 (one bad timestamp),
against a real tracker service.

Point 1, a producer that starts late.

Four gateways produce with event time; one uploads its first batch (old events) after
the others moved on. Declared with the pipeline, the late front holds the ingest
segment until it registers, and every record reaches the sink. Undeclared, it is
refused as behind (FrontBehind), and the consumer sees it: the tracker's status counts
and names it. A declared front that never comes is retired by its deadline, visibly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from lowtide.core.errors import FrontBehind, FrontOwned
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import ManualClock, TimeGrid
from lowtide.service import Agent, TrackerService
from lowtide.service.clock import wall_ms
from lowtide.spark.sources.front import Front, Labelled
from lowtide.spark.sources.lateness import TimesOutOfRange
from lowtide.spark.tracking.transport import TrackerRef, connect
from tests.spark.sources.helpers import consume, wait_for_min

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
GATEWAYS = (1, 2, 3, 4)


@pytest.fixture
def service() -> Iterator[TrackerService]:
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        yield svc
        connect(TrackerRef(svc.url, GRAPH, GRID)).close()  # the fronts' agent, before the stop


def gateway(ref: TrackerRef, front: int) -> Front:
    return Front(None, front, ref, segment="src", time_from="ts", heartbeat_ms=5,
                 owner=f"gateway-{front}")


def events(t0_ms: int, *offsets_ms: int) -> pd.DataFrame:
    return pd.DataFrame({"ts": pd.to_datetime([t0_ms + o for o in offsets_ms], unit="ms")})


def millis(*ts_ms: int) -> pa.Table:
    """Event times as plain int64 milliseconds (a far-future one fits no datetime)."""
    return pa.table({"ts": pa.array(ts_ms, pa.int64())})


def produce(front: Front, frame: pd.DataFrame) -> Labelled:
    batch = front.label(frame)
    front.written(batch)  # "written to the topic"
    return batch


def early_gateways(ref: TrackerRef, consumer: Agent, t0: int) -> list[Front]:
    """Gateways 1-3 produce 2 s of events and heartbeat past them; the consumer reads
    them."""
    fronts = [gateway(ref, f) for f in GATEWAYS[:3]]
    batches = [produce(f, events(t0, 0, 1_000, 2_000)) for f in fronts]
    time.sleep(0.3)
    for b in batches:
        consume(consumer, b.times, b.acks)
    return fronts


def test_a_declared_late_producer_is_waited_for(service: TrackerService) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    with Agent.connect(service.url, GRAPH) as consumer:
        for f in GATEWAYS:  # what Pipeline.read_stream(df, fronts=[1, 2, 3, 4]) does
            consumer.declare_front(f, "src", owner="pipeline")
        fronts = early_gateways(ref, consumer, t0)
        time.sleep(0.2)
        t0_slot = t0 // GRID.delta_ms
        assert consumer.status()["fronts_declared"] == {"4": ["src", t0_slot, -1]}
        assert int(consumer.status()["segments"][0]["min_time"]) == t0_slot  # held for 4
        late = gateway(ref, 4)  # 45 s in: its first batch holds the oldest events
        fronts.append(late)
        batch = produce(late, events(t0, 0, 500))
        consume(consumer, batch.times, batch.acks)  # never AckBehindHead
        done = min(f.close() for f in fronts)  # every record of every gateway received
        assert wait_for_min(consumer, 1, done - 1) == done
        status = consumer.status()
        assert status["fronts_declared"] == {} and status["front_events"]["behind"] == 0


def test_an_undeclared_late_producer_is_refused_and_the_consumer_sees_it(
    service: TrackerService,
) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    with Agent.connect(service.url, GRAPH) as consumer:
        fronts = early_gateways(ref, consumer, t0)
        wait_for_min(consumer, 0, t0 // 10)
        late = gateway(ref, 4)
        with pytest.raises(FrontBehind, match="declare every front"):
            late.label(events(t0, 0, 500))  # nothing labelled, nothing written
        events_doc = consumer.status()["front_events"]
        assert events_doc["behind"] == 1
        assert "front 4 registers at" in events_doc["recent"][-1]
        deadline = time.monotonic() + 10  # the metrics refresh once a second
        while b"lowtide_fronts_refused_total{pipeline=\"default\"} 1.0" not in (
                service.server.metrics.render()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b'lowtide_fronts_refused_total{pipeline="default"} 1.0' in (
            service.server.metrics.render())
        for f in fronts:
            f.close()


def test_a_clock_front_whose_clock_the_segment_passed_starts_at_its_min_time(
    service: TrackerService,
) -> None:
    """Fronts started together race: another front's heartbeat may pass a front's
    clock reading before it registers (a CI run under load: FrontBehind). A clock
    front has labelled nothing, so it starts at the segment's min time, and labels
    there: never behind what was announced. From there its clock counts on: a clock
    60 s slow (a producer machine's) does not hold the segment for 60 s at the slot
    it started at (before, its heartbeats stayed there until its clock caught up)."""
    ref = TrackerRef(service.url, GRAPH, GRID)
    with Agent.connect(service.url, GRAPH) as consumer:
        ahead = Front(None, 1, ref, segment="src", heartbeat_ms=5)
        floor = wait_for_min(consumer, 0, wall_ms() // GRID.delta_ms)
        slow = ManualClock(wall_ms() - 60_000)  # read 60 s ago
        behind = Front(None, 2, ref, segment="src", heartbeat_ms=None, clock=slow)
        batch = produce(behind, events(0, 0))
        assert int(batch.times.min()) >= floor
        consume(consumer, batch.times, batch.acks)  # never AckBehindHead
        assert consumer.status()["front_events"]["behind"] >= 1  # the first try, seen
        top = int(batch.times.max())
        slow.advance(50)  # five slots later by its own clock
        assert behind.heartbeat() == top + 5
        later = produce(behind, events(0, 0))
        assert int(later.times.min()) == top + 5  # labels count on from there too
        consume(consumer, later.times, later.acks)
        slow.advance(10)
        behind.heartbeat()
        assert wait_for_min(consumer, 0, top + 5) > top + 5  # the segment passes both
        for f in (ahead, behind):
            f.close()


def test_a_restarted_front_whose_clock_is_slow_counts_on_from_its_promise(
    service: TrackerService,
) -> None:
    """A producer with a slow clock restarts (close(end=False), a successor with the
    same owner): the successor resumes at its predecessor's promise, ahead of its
    clock, and counts on from there instead of holding that slot."""
    ref = TrackerRef(service.url, GRAPH, GRID)
    with Agent.connect(service.url, GRAPH) as consumer:
        ahead = Front(None, 1, ref, segment="src", heartbeat_ms=5)
        wait_for_min(consumer, 0, wall_ms() // GRID.delta_ms)
        slow = ManualClock(wall_ms() - 60_000)
        first = Front(None, 2, ref, segment="src", heartbeat_ms=None, clock=slow, owner="p")
        batch = produce(first, events(0, 0))
        consume(consumer, batch.times, batch.acks)
        promised = first.close(end=False)
        successor = Front(None, 2, ref, segment="src", heartbeat_ms=None, clock=slow,
                          owner="p")
        later = produce(successor, events(0, 0))
        top = int(later.times.max())
        assert top >= promised
        consume(consumer, later.times, later.acks)
        slow.advance(30)
        assert successor.heartbeat() == top + 3
        for f in (ahead, successor):
            f.close()


class RacedTracker:
    """A tracker whose segment's min time another front's heartbeat moves on right
    after each of the first ``races`` reads of it: a register at the min time read is
    refused as behind that many times (a CI run: 2 in a row)."""

    def __init__(self, floor: int, races: int) -> None:
        self.floor, self.races = floor, races
        self.registered: list[int] = []

    def status(self) -> dict[str, Any]:
        read = self.floor
        if self.races:
            self.races, self.floor = self.races - 1, self.floor + 1
        return {"segments": [{"segment": "src", "min_time": read}]}

    def register_front(self, front: int, segment: str, time: int, *, owner: str = "") -> None:
        if time < self.floor:
            raise FrontBehind(f"front {front} registers at {time}, below {self.floor}")
        self.registered.append(time)


def test_a_clock_front_registers_at_the_min_time_however_often_it_moves_on() -> None:
    from lowtide.spark.sources.front_feeds import Feeds

    tracker: Any = RacedTracker(floor=1_000, races=3)
    assert Feeds(2, tracker, GRAPH, ("src",), None).register(900, "owner", GRID,
                                                             clock=True) == 1_003
    assert tracker.registered == [1_003]
    calm: Any = RacedTracker(floor=1_000, races=0)
    with pytest.raises(FrontBehind):  # an event-time front is refused as before
        Feeds(3, calm, GRAPH, ("src",), None).register(900, "owner", GRID)


def test_a_declared_front_that_never_comes_is_retired_by_its_deadline(
    service: TrackerService,
) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    with Agent.connect(service.url, GRAPH) as consumer:
        consumer.declare_front(4, "src", owner="pipeline", retire_after_ms=1_000)
        fronts = early_gateways(ref, consumer, t0)
        assert int(consumer.status()["segments"][0]["min_time"]) == t0 // 10  # waits for 4
        assert wait_for_min(consumer, 1, t0 // 10) > t0 // 10  # ... until its deadline
        status = consumer.status()
        assert status["fronts_declared"] == {} and status["front_events"]["retired"] == 1
        assert "front 4 was declared" in status["front_events"]["recent"][-1]
        for f in fronts:
            f.close()


# ---------------------------------------------- issue 29 point 3: one bad timestamp
def test_one_far_future_time_is_found_before_label_returns(service: TrackerService) -> None:
    """A unit mix-up (microseconds as milliseconds) in one record: label() hands it
    back and counts it, the good records are labelled, and no flush is refused after
    the producer wrote them (before: the whole flush was refused once label() had
    returned, and the good records were orphaned)."""
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    front = gateway(ref, 1)
    with Agent.connect(service.url, GRAPH) as consumer:
        batch = front.label(millis(t0, t0 + 10, t0 * 1000))  # the last one in microseconds
        assert len(batch) == 2 and len(batch.rejected) == 1
        assert front.status()["out_of_range"] == 1
        front.written(batch)
        front.flush()  # the tracker took every ack: nothing refused
        consume(consumer, batch.times, batch.acks)
        done = front.close()
        assert wait_for_min(consumer, 1, done - 1) == done


def test_under_raise_a_bad_time_refuses_the_batch_before_any_ack(
    service: TrackerService,
) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    t0 = wall_ms() - 60_000
    front = Front(None, 1, ref, segment="src", time_from="ts", heartbeat_ms=5,
                  owner="gateway-1", late="raise")
    produce(front, events(t0, 0))
    with pytest.raises(TimesOutOfRange, match="unit mix-up"):
        front.label(millis(t0 + 10, t0 * 1000))
    assert front.status()["out_of_range"] == 1
    front.flush()
    assert service.status()["segments"][0]["sent"] == 1  # only the first batch's ack
    front.close()


# --------------------------------- issue 29 point 2: two producers of one front id
def test_a_second_producer_of_one_front_is_refused(service: TrackerService, tmp_path) -> None:
    ref = TrackerRef(service.url, GRAPH, GRID)
    first = Front(tmp_path / "a", 1, ref, segment="src", heartbeat_ms=5)
    first.send([b"x"])
    with pytest.raises(FrontOwned, match="two producers configured with one front id"):
        Front(tmp_path / "b", 1, ref, segment="src", heartbeat_ms=5)  # another log, owner
    before = service.status()["fronts"]["1"][1]
    time.sleep(0.1)
    assert service.status()["fronts"]["1"][1] >= before  # the first one still owns it
    first.close(end=False)  # a pause: its successor resumes
    successor = Front(tmp_path / "a", 1, ref, segment="src", heartbeat_ms=5)  # its log
    assert successor.end_offset == 1
    successor.close()
