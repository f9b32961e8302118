"""Graph generations (rule 16): attach, replace and detach segments on a running
tracker. Worked examples, then a property test under random interleavings with named
invariants:

* NEVER_PREMATURE: no announced min time (a segment's or the global one) exceeds the
  time of an item in flight in that segment (anywhere, for the global one), at any
  moment, across every change of the graph.
* MONOTONIC: no min time ever goes back, the global one included, whatever is attached.
* LIVENESS: once every item is received and every live front heartbeats past T, every
  attached segment and the global min time reach T (rounded down to its window).
* DETACH_REPORTS: a detached segment reports exactly the items it had in flight.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowtide.core.errors import AckBehindHead, GenerationOutOfOrder, ProtocolError
from lowtide.core.generations import GraphChange, follows, next_graph
from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig


def chain(k: int) -> tuple[SegmentSpec, SegmentSpec]:
    """Query ``k``: its source segment and its sink segment."""
    return SegmentSpec(f"in{k}", ()), SegmentSpec(f"out{k}", (f"in{k}",))


def first_query(window_slots: int = 1) -> Tracker:
    graph = SegmentGraph.of(*chain(0))
    return TrackerConfig(graph, TimeGrid(10, window_slots)).build()


def updates(tracker: Tracker) -> list[tuple[str | None, int]]:
    return [(u.segment, u.time) for u in tracker.step(0).updates]


def test_attach_keeps_indices_and_starts_at_the_time_it_first_reads() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.apply(AckBatch.of([Ack(0, 100, 0xA, +1)]))     # one item in flight in in0
    tr.heartbeat(Heartbeat(1, 150))
    assert updates(tr) == [("in0", 100), ("out0", 100), (None, 100)]
    tr.change_graph(GraphChange(1, attach=chain(1), start=120))
    assert tr.graph.names == ("in0", "out0", "in1", "out1")   # old indices kept
    assert tr.min_times() == (100, 100, 120, 120)              # held at its start
    assert updates(tr) == []                                   # nothing moves before a front
    tr.register_front(RegisterFront(2, "in1", 130))
    assert updates(tr) == [("in1", 130), ("out1", 130)]
    with pytest.raises(AckBehindHead):                         # fail closed: below its start
        tr.apply(AckBatch.of([Ack(2, 110, 0xB, +1)]))
    assert tr.min_time() == 100                                # in0's item holds the global


def test_a_start_below_the_global_min_time_is_refused() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.step(0)
    with pytest.raises(ProtocolError, match="below the global min time 100"):
        tr.change_graph(GraphChange(1, attach=chain(1), start=90))
    tr.change_graph(GraphChange(1, attach=chain(1)))          # None: at the global min
    assert tr.min_time("in1") == 100 and tr.generation == 1


def test_an_attached_segment_reading_an_old_one_starts_at_its_min_time() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.heartbeat(Heartbeat(1, 100))
    tr.step(0)
    tr.change_graph(GraphChange(1, attach=(SegmentSpec("audit", ("in0",)),), start=500))
    assert tr.min_time("audit") == 100          # what in0 still sends may be as old
    tr.apply(AckBatch.of([Ack(2, 100, 0xC, +1)]))
    tr.heartbeat(Heartbeat(1, 200))
    assert ("audit", 200) not in updates(tr) and tr.min_time("audit") == 100


def test_detach_reports_in_flight_items_and_releases_the_rest() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.change_graph(GraphChange(1, attach=chain(1), start=100))
    tr.register_front(RegisterFront(2, "in1", 100))
    tr.apply(AckBatch.of([Ack(0, 100, 0xA, +1), Ack(0, 103, 0xB, +1)]))
    tr.heartbeat(Heartbeat(1, 300))
    tr.heartbeat(Heartbeat(2, 300))
    assert tr.step(0).updates and tr.min_time() == 100       # in0 holds the global
    gone = tr.change_graph(GraphChange(2, detach=("out0", "in0")))
    assert [(d.segment, d.in_flight) for d in gone] == [
        ("out0", ()), ("in0", ((100, 101, 1), (103, 104, 1)))]
    assert "2 item(s) in flight" in gone[1].describe()
    assert updates(tr) == [(None, 300)]                        # only in1, out1 count now
    assert tr.fronts() == {2: ("in1", 300)}                    # its front is dropped
    with pytest.raises(ProtocolError, match="detached"):
        tr.apply(AckBatch.of([Ack(0, 400, 0xC, +1)]))
    with pytest.raises(ProtocolError, match="detached"):
        tr.register_front(RegisterFront(3, "in0", 400))


def test_replace_keeps_every_min_time_and_the_generation_moves_on() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.step(0)
    assert tr.change_graph(GraphChange(1, replace=("out0",))) == ()
    assert tr.generation == 1 and tr.min_times() == (100, 100)


@pytest.mark.parametrize(("change", "error"), [
    (GraphChange(2, attach=chain(1)), GenerationOutOfOrder),     # skips generation 1
    (GraphChange(0, attach=chain(1)), GenerationOutOfOrder),     # goes back
    (GraphChange(1, detach=("in0",)), ProtocolError),            # out0 still reads it
    (GraphChange(1, detach=("in0", "out0")), ProtocolError),     # nothing would be left
    (GraphChange(1, attach=(SegmentSpec("out0", ()),)), ProtocolError),  # name taken
    (GraphChange(1, attach=(SegmentSpec("x", ("nowhere",)),)), ProtocolError),
    (GraphChange(1, replace=("nowhere",)), ProtocolError),
])
def test_bad_changes_are_refused_with_the_state_unchanged(change: GraphChange,
                                                          error: type[Exception]) -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.step(0)
    with pytest.raises(error):
        tr.change_graph(change)
    assert tr.generation == 0 and tr.graph.names == ("in0", "out0")
    assert tr.min_times() == (100, 100)


def test_a_snapshot_of_a_later_generation_restores_it_and_an_earlier_is_refused() -> None:
    tr = first_query()
    tr.register_front(RegisterFront(1, "in0", 100))
    tr.change_graph(GraphChange(1, attach=chain(1), start=100))
    tr.change_graph(GraphChange(2, detach=("out0", "in0")))
    tr.step(0)
    snap = tr.snapshot()
    fresh = first_query()
    fresh.restore(snap)
    assert (fresh.generation, fresh.graph, fresh.min_times()) == (2, tr.graph, tr.min_times())
    with pytest.raises(GenerationOutOfOrder):  # an older generation than it has
        fresh.restore(dataclasses.replace(snap, generation=1))
    other = SegmentGraph.of(("x", ()), ("y", ("x",)), ("z", ()))
    with pytest.raises(GenerationOutOfOrder):  # a graph that does not follow its own
        first_query().restore(dataclasses.replace(snap, graph=other))


def test_follows_and_the_order_of_a_later_generation() -> None:
    g0 = SegmentGraph.of(*chain(0))
    g1 = next_graph(g0, GraphChange(1, attach=chain(1)))
    assert follows(g0, g1) and not follows(g1, g0)
    other = SegmentGraph.of(("x", ()), ("y", ("x",)))
    assert not follows(g0, other)
    # a later generation's order is kept on the wire: not re-sorted as `of` would
    assert SegmentGraph.ordered([g1.spec(s) for s in range(4)]) == g1


# ---------------------------------------------------------------- properties
class GenerationsWorld:
    """Ground truth: queries ``in<k> -> out<k>``, one front each, items in flight per
    segment; the tracker gets the protocol-legal acks of every move."""

    def __init__(self, window_slots: int) -> None:
        self.tr = first_query(window_slots)
        self.w = window_slots
        self.items: dict[int, tuple[int, int]] = {}   # ack value -> (segment, time)
        self.front_time: dict[int, int] = {}          # live query k -> its front's time
        self.next_value = 1
        self.seen: dict[str | None, int] = {}
        self.tr.register_front(RegisterFront(0, "in0", 0))
        self.front_time[0] = 0
        self.queries = 1
        self.pending: dict[int, int] = {}              # attached query -> its start

    def value(self) -> int:
        self.next_value += 1
        return self.next_value * 0x9E3779B97F4A7C15 % (1 << 64) or 1

    def emit(self, k: int, dt: int) -> None:
        t = self.front_time[k] + dt
        v = self.value()
        self.tr.apply(AckBatch.of([Ack(self.tr.graph.index(f"in{k}"), t, v, +1)]))
        self.items[v] = (self.tr.graph.index(f"in{k}"), t)

    def process(self, v: int) -> None:
        """Take item ``v`` out of its segment: into out<k> as a child (sent first,
        rule 2), or out of the pipeline from out<k>."""
        s, t = self.items.pop(v)
        acks = []
        if self.tr.graph.names[s].startswith("in"):
            child = self.value()
            down = s + 1
            acks.append(Ack(down, t, child, +1))
            self.items[child] = (down, t)
        acks.append(Ack(s, t, v, -1))
        self.tr.apply(AckBatch.of(acks))

    def beat(self, k: int, dt: int) -> None:
        self.front_time[k] += dt
        self.tr.heartbeat(Heartbeat(k, self.front_time[k]))

    def attach(self, dt: int) -> None:
        """Attach query k at ``low + dt - 2``: below the global min time it is refused;
        its front registers later (:meth:`register`), at its start or after."""
        k, low = self.queries, self.tr.min_time()
        change = GraphChange(self.tr.generation + 1, attach=chain(k), start=low + dt - 2)
        if low + dt - 2 < low:
            with pytest.raises(ProtocolError, match=r"below the global min time|outside"):
                self.tr.change_graph(change)
            return
        self.tr.change_graph(change)
        self.pending[k] = low + dt - 2
        self.queries += 1

    def register(self, dt: int) -> None:
        if self.pending:
            k, start = self.pending.popitem()
            self.tr.register_front(RegisterFront(k, f"in{k}", start + dt))
            self.front_time[k] = start + dt

    def detach(self, k: int) -> None:
        ins, outs = self.tr.graph.index(f"in{k}"), self.tr.graph.index(f"out{k}")
        gone = self.tr.change_graph(GraphChange(self.tr.generation + 1,
                                                detach=(f"out{k}", f"in{k}")))
        reported = sum(c for d in gone for _s, _e, c in d.in_flight)
        held = [v for v, (s, _t) in self.items.items() if s in (ins, outs)]
        assert reported == len(held), "DETACH_REPORTS"
        for v in held:
            del self.items[v]
        del self.front_time[k]

    def step(self) -> None:
        self.tr.step(0)
        self.check()

    def check(self) -> None:
        g = self.tr.graph
        for s in range(len(g)):
            if g.is_detached(s):
                continue
            mine = [t for seg, t in self.items.values() if seg == s]
            assert all(self.tr.min_time(g.names[s]) <= t for t in mine), "NEVER_PREMATURE"
        assert all(self.tr.min_time() <= t for _s, t in self.items.values()), \
            "NEVER_PREMATURE (global)"
        now = {None: self.tr.min_time(), **{n: self.tr.min_time(n) for n in g.names}}
        assert all(now[n] >= t for n, t in self.seen.items()), "MONOTONIC"
        self.seen = now

    def drain(self, until: int) -> None:
        while self.pending:
            self.register(0)
        while self.items:
            self.process(next(iter(self.items)))
        for k in list(self.front_time):
            if self.front_time[k] < until:
                self.beat(k, until - self.front_time[k])
        self.step()
        g = self.tr.graph
        reach = until // self.w * self.w
        for s in range(len(g)):
            if not g.is_detached(s):
                assert self.tr.min_time(g.names[s]) >= reach, "LIVENESS"
        assert self.tr.min_time() >= reach, "LIVENESS (global)"


OPS = st.lists(st.tuples(st.sampled_from(["emit", "process", "beat", "step", "attach",
                                          "register", "detach"]),
                         st.integers(0, 7), st.integers(0, 5)), max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, window_slots=st.sampled_from([1, 4]))
def test_attach_and_detach_under_random_interleavings(
    ops: list[tuple[str, int, int]], window_slots: int
) -> None:
    """NEVER_PREMATURE and MONOTONIC after every step, DETACH_REPORTS at every
    detach, LIVENESS at the end."""
    world = GenerationsWorld(window_slots)
    for op, pick, dt in ops:
        live = sorted(world.front_time)
        k = live[pick % len(live)]
        if op == "emit":
            world.emit(k, dt)
        elif op == "process" and world.items:
            world.process(sorted(world.items)[pick % len(world.items)])
        elif op == "beat":
            world.beat(k, dt)
        elif op == "attach" and world.queries < 6:
            world.attach(dt)
        elif op == "register":
            world.register(dt)
        elif op == "detach" and len(live) > 1:
            world.detach(k)
        world.step()
    world.drain(max(world.front_time.values()) + 20)
