"""Property tests for declared fronts (issue 29 point 1), on the core tracker.

Live fronts emit items into ``src`` and heartbeat; a consumer receives items out of
``src`` into ``sink`` and out of ``sink``; *declared* fronts (at an explicit time, or
at the segment's start) register late, or are retired by hand or by their deadline;
steps come at random moments. Invariants:

* HELD (safety): while a declared front has neither registered nor been retired, no
  min time passes where it holds (its declared time, or where the segment started),
  and it can always register there: never refused as behind.
* SAFETY: no min time passes an item in flight in its segment.
* MONOTONIC: min times never go back.
* LIVENESS: once every declared front registered or was retired, every item was
  received and every front heartbeated past T, both segments reach T.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.fronts import AT_START
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    Ack,
    AckBatch,
    DeclareFront,
    Heartbeat,
    RegisterFront,
    RetireFront,
)
from lowtide.core.tracker import Tracker, TrackerConfig

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
START = 1_000
LIVE = (1, 2)
DECLARED = (10, 11, 12)
PIPELINE = 77  # the declaring owner

ops = st.lists(
    st.one_of(
        st.tuples(st.just("emit"), st.sampled_from(LIVE), st.integers(0, 5)),
        st.tuples(st.just("hb"), st.sampled_from(LIVE), st.integers(0, 8)),
        st.tuples(st.just("consume"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("register"), st.sampled_from(DECLARED), st.integers(0, 5)),
        st.tuples(st.just("retire"), st.sampled_from(DECLARED), st.just(0)),
        st.tuples(st.just("step"), st.integers(0, 50), st.just(0)),
    ),
    max_size=60,
)
declarations = st.lists(
    st.tuples(st.booleans(), st.integers(0, 30), st.one_of(st.none(), st.integers(0, 200))),
    min_size=len(DECLARED), max_size=len(DECLARED),
)


@dataclass
class World:
    tracker: Tracker
    hb: dict[int, int] = field(default_factory=dict)  # live or registered front -> time
    in_src: list[tuple[int, int]] = field(default_factory=list)  # (time, ack value)
    waiting: set[int] = field(default_factory=lambda: set(DECLARED))
    now_ms: int = 0
    mins: tuple[int, int] = (0, 0)
    next_value: int = 1

    def send(self, time: int) -> None:
        self.tracker.apply(AckBatch.of([Ack(0, time, self.next_value, 1)]))
        self.in_src.append((time, self.next_value))
        self.next_value += 1

    def consume(self, i: int) -> None:
        if not self.in_src:
            return
        time, value = self.in_src.pop(i % len(self.in_src))
        child = value | (1 << 40)
        self.tracker.apply(AckBatch.of([Ack(1, time, child, 1), Ack(0, time, value, -1)]))
        self.tracker.apply(AckBatch.of([Ack(1, time, child, -1)]))

    def hold(self, front: int) -> int | None:
        declared = self.tracker.declared_fronts().get(front)
        return None if declared is None or declared.time == AT_START else declared.time

    def step(self, dt: int) -> None:
        self.now_ms += dt
        self.tracker.step(self.now_ms)
        mins = (self.tracker.min_time("src"), self.tracker.min_time("sink"))
        assert mins[0] >= self.mins[0] and mins[1] >= self.mins[1], "MONOTONIC"
        self.mins = mins
        self.waiting &= set(self.tracker.declared_fronts())  # retired by deadline
        for front in self.waiting:
            hold = self.hold(front)
            assert hold is None or mins[0] <= hold, f"HELD: src passed front {front} at {hold}"
        for time, _v in self.in_src:
            assert mins[0] <= time and mins[1] <= time, "SAFETY"

    def register(self, front: int, dt: int) -> None:
        if front not in self.waiting:
            return
        hold = self.hold(front)
        if hold is None:  # the segment has not started: no front registered yet
            hold = max(self.hb.values(), default=START)
        time = hold + dt
        self.tracker.register_front(RegisterFront(front, "src", time, owner=front))  # HELD
        self.waiting.discard(front)
        self.hb[front] = time
        self.send(time)  # the late producer's first item, at its start


def apply(world: World, op: tuple[str, int, int]) -> None:
    kind, a, b = op
    if kind == "emit" and a in world.hb:
        world.send(world.hb[a] + b)
    elif kind == "hb" and a in world.hb:
        world.hb[a] += b
        world.tracker.heartbeat(Heartbeat(a, world.hb[a], owner=a))
    elif kind == "consume":
        world.consume(a)
    elif kind == "register":
        world.register(a, b)
    elif kind == "retire" and a in world.waiting:
        world.tracker.retire_front(RetireFront(a, PIPELINE))
        world.waiting.discard(a)
    elif kind == "step":
        world.step(a)


@settings(max_examples=300, deadline=None)
@given(declarations, ops, st.booleans())
def test_declared_fronts_are_held_safe_monotonic_and_live(
    decl: list[tuple[bool, int, int | None]], script: list[tuple[str, int, int]],
    first_live: bool,
) -> None:
    world = World(TrackerConfig(GRAPH).build())
    for front, (at_start, offset, retire_ms) in zip(DECLARED, decl, strict=True):
        time = AT_START if at_start else START + offset
        world.tracker.declare_front(DeclareFront(front, "src", time, PIPELINE, retire_ms), 0)
    live = LIVE if first_live else LIVE[:1]
    for front in live:
        world.tracker.register_front(RegisterFront(front, "src", START, owner=front))
        world.hb[front] = START
    for op in script:
        apply(world, op)
        world.step(0)
    # LIVENESS: everything registered or retired, received, and heartbeated past T
    for front in sorted(world.waiting):
        world.register(front, 0)
    while world.in_src:
        world.consume(0)
    target = max(world.hb.values()) + 10
    for front in world.hb:
        world.tracker.heartbeat(Heartbeat(front, target, owner=front))
    world.step(1)
    assert world.mins == (target, target), "LIVENESS"
