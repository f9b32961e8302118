"""Dead fronts by policy (issue 34 point 2, rule 17): worked examples and a property.

Worked example: ``src -> sink``, windows of 1 slot, ``front_timeout`` 5 s. Fronts 1 and 2
register at slot 100; front 2 sends item X at slot 105 and then goes silent (its
producer died) with its heartbeat at 100; front 1 goes on to 200.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.dead_fronts import RETIRE, WAIT, BadFrontTimeout, FrontTimeout
from lowtide.core.errors import UnknownFront
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
from lowtide.core.tracker import Tracker, TrackerConfig

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
TIMEOUT_MS = 5_000
X, X1 = 0xA0, 0xA1


def tracker(policy: str) -> Tracker:
    return TrackerConfig(GRAPH, front_timeout=FrontTimeout(TIMEOUT_MS, policy)).build()


def worked_example(policy: str) -> Tracker:
    tr = tracker(policy)
    tr.register_front(RegisterFront(1, "src", 100, owner=1), now_ms=0)
    tr.register_front(RegisterFront(2, "src", 100, owner=2), now_ms=0)
    tr.apply(AckBatch.of([Ack(0, 105, X, 1)]))  # front 2's item X, sent, not yet received
    for now in range(0, 10_000, 1_000):
        tr.heartbeat(Heartbeat(1, 100 + now // 50, owner=1), now_ms=now)  # up to 280
        tr.step(now)
    return tr


def test_wait_states_the_dead_front_and_holds_its_segment() -> None:
    tr = worked_example(WAIT)
    (dead,) = tr.dead_fronts()
    assert (dead.front, dead.time, dead.silent_since_ms, dead.retired_ms) == (2, 100, 0, None)
    assert dead.describe(GRAPH.names) == (
        "front 2 dead, waited for: silent since 0.0 s on 'src', its heartbeat at slot 100")
    assert tr.min_time("src") == 100  # waits for front 2, as it said
    tr.heartbeat(Heartbeat(2, 150, owner=2), now_ms=10_000)  # it was only slow
    tr.step(10_000)
    assert tr.dead_fronts() == [] and tr.min_time("src") == 105  # X still in flight


def test_the_dead_front_is_found_once_at_the_timeout() -> None:
    tr = tracker(WAIT)
    tr.register_front(RegisterFront(2, "src", 100), now_ms=0)
    assert tr.step(4_999).dead == ()
    assert [d.front for d in tr.step(5_000).dead] == [2]
    assert tr.step(6_000).dead == ()  # reported once


def test_retire_lets_the_rest_progress_and_keeps_its_items_tracked() -> None:
    tr = tracker(RETIRE)
    tr.register_front(RegisterFront(1, "src", 100, owner=1), now_ms=0)
    tr.register_front(RegisterFront(2, "src", 100, owner=2), now_ms=0)
    tr.apply(AckBatch.of([Ack(0, 105, X, 1)]))
    tr.heartbeat(Heartbeat(1, 280, owner=1), now_ms=4_000)
    assert tr.step(4_000).dead == () and tr.min_time("src") == 100
    tr.heartbeat(Heartbeat(1, 290, owner=1), now_ms=5_000)
    (dead,) = tr.step(5_000).dead
    assert (dead.front, dead.retired_ms, dead.in_flight) == (2, 5_000, ((105, 106, 1),))
    assert dead.describe(GRAPH.names) == (
        "front 2 retired at 5.0 s: silent since 0.0 s on 'src', its heartbeat at slot 100; "
        "still tracked in flight there: 1 item(s) in slots [105, 106)")
    assert tr.fronts() == {1: ("src", 290)}
    assert tr.min_time("src") == 105  # NEVER PREMATURE: X (slot 105) is still in flight
    tr.apply(AckBatch.of([Ack(1, 105, X1, 1), Ack(0, 105, X, -1)]))  # received at last
    tr.apply(AckBatch.of([Ack(1, 105, X1, -1)]))
    tr.step(5_100)
    assert (tr.min_time("src"), tr.min_time("sink")) == (290, 290)  # the rest progressed
    # a retired front that was only slow fails no session (its agent may carry other
    # fronts): below its segment's min time, or from another owner, its heartbeat
    # changes nothing; by its owner at or above it, it rejoins there
    tr.apply_flush(AckBatch.of([]), [Heartbeat(2, 280, owner=2)], session=7, now_ms=6_000)
    tr.heartbeat(Heartbeat(2, 300, owner=9), now_ms=6_000)
    assert tr.fronts() == {1: ("src", 290)}
    with pytest.raises(UnknownFront):  # a front never seen is refused as before
        tr.heartbeat(Heartbeat(9, 300, owner=9), now_ms=6_000)
    back = tracker(RETIRE)
    back.restore(tr.snapshot())  # a restart knows it too
    for rejoined in (tr, back):
        rejoined.apply_flush(AckBatch.of([]), [Heartbeat(2, 300, owner=2)], session=7,
                             now_ms=6_000)
        assert rejoined.fronts() == {1: ("src", 290), 2: ("src", 300)}


def test_a_front_moved_by_keyed_batches_lives_while_a_batch_on_its_segment_runs() -> None:
    tr = tracker(RETIRE)
    tr.register_front(RegisterFront(1, "src", 100), now_ms=0)
    tr.apply_flush(AckBatch.of([]), [Heartbeat(1, 110)], session=None, now_ms=0)  # a task's
    tr.batches.open("q", 0, ("src", "sink"), now_ms=0)
    for now in range(0, 40_000, 1_000):  # a batch of 40 s, its driver alive
        tr.batches.open("q", 0, ("src", "sink"), now_ms=now)
        assert tr.step(now).dead == ()
    tr.batches.close("q", 0, 40_000)
    assert tr.step(43_999).dead == ()  # last seen at the last step the batch ran, 39 s
    assert [d.front for d in tr.step(44_000).dead] == [1]  # then silent for the timeout


def test_a_restored_tracker_keeps_the_silence_and_older_snapshots_start_it_afresh() -> None:
    tr = tracker(RETIRE)
    tr.register_front(RegisterFront(2, "src", 100), now_ms=1_000)
    back = tracker(RETIRE)
    back.restore(tr.snapshot())
    assert [d.front for d in back.step(6_000).dead] == [2]
    old = tracker(RETIRE)
    old.restore(tr.snapshot().__class__(**{**tr.snapshot().__dict__, "seen": ()}))
    assert old.step(6_000).dead == ()  # seen "now" at the first check: a later death
    assert [d.front for d in old.step(11_000).dead] == [2]


@pytest.mark.parametrize(("timeout_ms", "policy"), [(0, WAIT), (1_000, "drop")])
def test_a_bad_timeout_or_policy_is_refused_with_what_to_use(timeout_ms: int, policy: str) -> None:
    with pytest.raises(BadFrontTimeout, match=r"front_timeout|use 'wait' or 'retire'"):
        FrontTimeout(timeout_ms, policy)


# ------------------------------------------------------------------------- property
LIVE = (1, 2, 3)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("emit"), st.sampled_from(LIVE), st.integers(0, 5)),
        st.tuples(st.just("hb"), st.sampled_from(LIVE), st.integers(0, 8)),
        st.tuples(st.just("consume"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("die"), st.sampled_from(LIVE), st.just(0)),
        st.tuples(st.just("rejoin"), st.sampled_from(LIVE), st.integers(0, 5)),
        st.tuples(st.just("step"), st.integers(0, 3_000), st.just(0)),
    ),
    max_size=80,
)


@dataclass
class World:
    """Fronts emit into ``src`` and heartbeat while alive; a consumer receives out of
    ``src`` into ``sink`` and out of ``sink``; a front may die (silent for good, with
    items in flight) and come back (register again, as its successor would)."""

    tracker: Tracker
    hb: dict[int, int] = field(default_factory=dict)  # live fronts -> time
    dead: set[int] = field(default_factory=set)  # silent: the tracker does not know yet
    in_flight: list[tuple[int, int, int]] = field(default_factory=list)  # (seg, time, v)
    now_ms: int = 0
    mins: tuple[int, int] = (0, 0)
    value: int = 1

    def emit(self, front: int, dt: int) -> None:
        if front in self.hb and front not in self.dead:
            time = self.hb[front] + dt
            self.tracker.apply(AckBatch.of([Ack(0, time, self.value, 1)]))
            self.in_flight.append((0, time, self.value))
            self.value += 1

    def consume(self, i: int) -> None:
        if self.in_flight:
            seg, time, v = self.in_flight.pop(i % len(self.in_flight))
            if seg == 0:  # child first (rule 2)
                self.tracker.apply(AckBatch.of([Ack(1, time, v | 1 << 40, 1), Ack(0, time, v, -1)]))
                self.in_flight.append((1, time, v | 1 << 40))
            else:
                self.tracker.apply(AckBatch.of([Ack(1, time, v, -1)]))

    def beat(self, front: int, dt: int) -> None:
        if front in self.hb and front not in self.dead:
            self.hb[front] += dt
            self.tracker.heartbeat(Heartbeat(front, self.hb[front], owner=front), self.now_ms)

    def rejoin(self, front: int, dt: int) -> None:
        if front in self.hb and front not in self.tracker.fronts():  # retired: its successor
            time = max(self.mins[0], self.hb[front]) + dt
            self.tracker.register_front(RegisterFront(front, "src", time, owner=front),
                                        self.now_ms)
            self.hb[front] = time
            self.dead.discard(front)

    def step(self, dt: int) -> None:
        self.now_ms += dt
        for front in self.hb.keys() - self.dead:  # a live producer beats within its timeout
            if front in self.tracker.fronts():
                self.tracker.heartbeat(Heartbeat(front, self.hb[front], owner=front),
                                       self.now_ms)
        for d in self.tracker.step(self.now_ms).dead:
            assert d.front in self.dead, f"a live front {d.front} was declared dead"
        mins = (self.tracker.min_time("src"), self.tracker.min_time("sink"))
        assert mins[0] >= self.mins[0] and mins[1] >= self.mins[1], "MONOTONIC"
        self.mins = mins
        for seg, time, _v in self.in_flight:  # NEVER PREMATURE, retired fronts' items too
            assert mins[0] <= time or seg == 1, "SAFETY (src)"
            assert mins[1] <= time, "SAFETY (sink)"
        for front in set(self.tracker.fronts()) & self.hb.keys():
            assert mins[0] <= self.hb[front], "SAFETY: a live front's heartbeat passed"


@settings(max_examples=300, deadline=None)
@given(ops, st.sampled_from([WAIT, RETIRE]))
def test_retirement_is_never_premature_under_random_interleavings(
    script: list[tuple[str, int, int]], policy: str,
) -> None:
    world = World(tracker(policy))
    for front in LIVE:
        world.tracker.register_front(RegisterFront(front, "src", 1_000, owner=front), 0)
        world.hb[front] = 1_000
    for kind, a, b in script:
        if kind == "emit":
            world.emit(a, b)
        elif kind == "hb":
            world.beat(a, b)
        elif kind == "consume":
            world.consume(a)
        elif kind == "die":
            world.dead.add(a)
        elif kind == "rejoin":
            world.rejoin(a, b)
        else:
            world.step(b)
    # LIVENESS: every item received; the living (and, retired, the dead) let src pass T
    while world.in_flight:
        world.consume(0)
    target = max(world.hb.values()) + 10
    for front in world.hb.keys() - world.dead:
        if front in world.tracker.fronts():
            world.hb[front] = target
    world.step(TIMEOUT_MS)  # the dead are now silent past the timeout
    world.step(0)
    registered = set(world.tracker.fronts())  # under "wait", the dead still hold src
    if not world.dead & registered and (world.hb.keys() - world.dead) & registered:
        assert world.mins == (target, target), "LIVENESS"
