"""Rule 3 at a front labelled by its clock, whatever the clock does: readings that jump
back or forward, a start behind where its segment stands (it registers there and
counts on from there), batches written out of order. Core tracker, no sockets.

Invariants, over any sequence of those events:

* safety: heartbeats never go back, never pass a batch labelled and not yet written,
  and no label is below a heartbeat sent before it or below where the front started;
* liveness: once every batch is written and the clock has moved one slot past its
  highest reading, the heartbeat passes every label; a clock minutes slow needs no
  more (before, its heartbeats stayed at the slot it started at until the clock
  reached it).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.sources.front import Front, Labelled
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0

NOW_MS = T0 + 3_600_000  # where the segment stands: an hour past T0


class JumpyClock:
    """A clock set by hand, backwards too (an NTP step on the producer's machine)."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def now_ms(self) -> int:
        return self.ms


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("clock"), st.integers(-5_000, 5_000)),
    st.tuples(st.just("label"), st.integers(1, 3)),
    st.tuples(st.just("write"), st.integers(0, 9)),
    st.tuples(st.just("beat"), st.just(0)),
), max_size=40)


def started_behind(behind_ms: int) -> tuple[CoreAgent, Front, JumpyClock, int]:
    """Front 1 moves the ingest segment to NOW_MS's slot; front 2's clock reads
    ``behind_ms`` earlier. Returns front 2, its clock and the segment's min time."""
    agent = CoreAgent(GRAPH, GRID)
    lead = Front(None, 1, agent, segment="ingest", grid=GRID, clock=JumpyClock(NOW_MS),
                 heartbeat_ms=None)
    lead.heartbeat()
    floor = agent.step()["ingest"]
    clock = JumpyClock(NOW_MS - behind_ms)
    front = Front(None, 2, agent, segment="ingest", grid=GRID, clock=clock, heartbeat_ms=None)
    return agent, front, clock, floor


@settings(max_examples=200)
@given(behind_ms=st.integers(0, 20 * 60_000), events=EVENTS)
def test_a_clock_front_keeps_rule_3_whatever_its_clock_does(
    behind_ms: int, events: list[tuple[str, int]]
) -> None:
    _agent, front, clock, floor = started_behind(behind_ms)
    start = front.status()["last_heartbeat"]
    assert start >= floor  # never below what the segment announced
    beats, unwritten, labels = [start], [], []
    highest_ms = clock.ms
    for kind, n in events:
        if kind == "clock":
            clock.ms += n
            highest_ms = max(highest_ms, clock.ms)
        elif kind == "label":
            batch: Labelled = front.label([b"x"] * n)
            assert int(batch.times.min()) >= max(beats)  # never below a heartbeat sent
            unwritten.append(batch)
            labels.append(int(batch.times.max()))
        elif kind == "write" and unwritten:
            front.written(unwritten.pop(n % len(unwritten)))
        else:
            beats.append(front.heartbeat())
            assert beats[-1] >= beats[-2]  # monotonic
            if unwritten:  # never past a batch not yet written
                assert beats[-1] <= min(int(b.times.min()) for b in unwritten)
    for batch in unwritten:
        front.written(batch)
    clock.ms = highest_ms + GRID.delta_ms
    assert front.heartbeat() > max(labels, default=start - 1)  # liveness
