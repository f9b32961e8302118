"""What a step leaves out when it can: the min-time walk when nothing changed since
the last one (an idle tracker's ticks), with worked examples and the property that
skipping never changes what is announced (QUIET: a tracker that skips announces
exactly what one that always walks its table does, step for step); and the look for
stuck windows, every tenth of ``stuck_after_ms``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.diagnostics import StuckDetector
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig

GRAPH = SegmentGraph.of(("src", ()), ("a", ("src",)), ("sink", ("a",)))


def tracker() -> Tracker:
    t = TrackerConfig(GRAPH, grid=TimeGrid(10, 2)).build()
    t.register_front(RegisterFront(1, "src", 0))
    return t


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    """Rows (segment, time, ack id, count)."""
    seg, time, ids, count = zip(*rows, strict=True)
    return AckBatch.from_columns(seg, time, ids, count)


def updates(t: Tracker, now_ms: int) -> list[tuple[str | None, int]]:
    return [(u.segment, u.time) for u in t.step(now_ms).updates]


class Scans:
    """Counts a checksum table's head scans."""

    def __init__(self, t: Tracker) -> None:
        self.n, table = 0, t._table
        scan = table.first_open

        def counted(*args: Any) -> int:
            self.n += 1
            return scan(*args)

        table.first_open = counted  # type: ignore[method-assign]


def test_a_step_with_nothing_changed_walks_no_table() -> None:
    t = tracker()
    scans = Scans(t)
    t.heartbeat(Heartbeat(1, 6))
    assert updates(t, 1) == [("src", 6), ("a", 6), ("sink", 6), (None, 6)]
    walked = scans.n
    assert walked == 3  # one head per segment
    assert updates(t, 2) == [] and updates(t, 3) == []
    assert scans.n == walked  # the ticks in between walked nothing
    t.apply(acks((0, 7, 5, 1)))  # an item in src at 7
    t.heartbeat(Heartbeat(1, 12))
    assert updates(t, 4) == []  # held at 6: window [6, 8) is open
    assert scans.n == 2 * walked
    t.apply(acks((0, 7, 5, -1), (1, 7, 9, 1)))  # taken out of src into a
    assert updates(t, 5) == [("src", 12)]


def test_a_graph_change_or_a_restore_steps_again() -> None:
    t = tracker()
    t.heartbeat(Heartbeat(1, 4))
    updates(t, 1)
    snapshot = t.snapshot()
    other = tracker()
    other.restore(snapshot)
    scans = Scans(other)
    assert updates(other, 2) == []  # the restored min times are the announced ones
    assert scans.n == 3  # but it walked: its table and fronts were loaded


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Steps between heartbeats and items moving src -> a -> out of a (the sink)."""
    ops = draw(st.lists(st.sampled_from(("step", "step", "beat", "emit", "move", "done")),
                        max_size=60))
    return [(op, draw(st.integers(0, 3))) for op in ops]


@settings(max_examples=200, deadline=None)
@given(history=histories())
def test_quiet_skipping_announces_what_a_full_walk_does(history: list[tuple[str, int]]) -> None:
    """QUIET: the same history on two trackers, one of them walking its table at every
    step; the same updates at every step."""
    skips, walks = tracker(), tracker()
    beat, now, next_id = 0, 0, 1
    in_src: list[tuple[int, int]] = []  # (time, id) per item
    in_a: list[tuple[int, int]] = []
    for op, arg in history:
        batch = None
        if op == "beat":
            beat += arg
            for t in (skips, walks):
                t.heartbeat(Heartbeat(1, beat))
        elif op == "emit":
            in_src.append((beat + arg, next_id))
            batch, next_id = acks((0, beat + arg, next_id, 1)), next_id + 1
        elif op == "move" and in_src:
            (time, ack), child = in_src.pop(arg % len(in_src)), next_id * 7919
            in_a.append((time, child))
            batch, next_id = acks((0, time, ack, -1), (1, time, child, 1)), next_id + 1
        elif op == "done" and in_a:
            time, ack = in_a.pop(arg % len(in_a))
            batch = acks((1, time, ack, -1))
        elif op == "step":
            now += 1
            walks._times._stepped = None
            assert updates(skips, now) == updates(walks, now)
        if batch is not None:
            for t in (skips, walks):
                t.apply(batch)
    now += 1
    walks._times._stepped = None
    assert updates(skips, now) == updates(walks, now)
    assert skips.min_times() == walks.min_times()


def test_stuck_windows_are_looked_for_every_tenth_of_stuck_after_ms() -> None:
    """Each look walks every open window: a tenth of ``stuck_after_ms`` (100 ms to
    1 s) reports a window at most 10% late, not ten looks a second."""
    assert [StuckDetector(ms).every_ms for ms in (300, 5_000, 600_000)] == [100, 500, 1_000]
    assert StuckDetector(5_000, check_every_ms=10).every_ms == 10
    t = TrackerConfig(GRAPH, stuck_after_ms=2_000).build()
    t.register_front(RegisterFront(1, "src", 0))
    looks = []
    observe = t._stuck.observe
    t._stuck.observe = lambda now, *a: looks.append(now) or observe(now, *a)  # type: ignore[method-assign]
    for now_ms in range(0, 1_000, 50):
        t.step(now_ms)
    assert looks == [0, 200, 400, 600, 800]
