"""Central tracker: worked examples, all-or-nothing protocol errors, snapshot/restore."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lowtide.core.errors import (
    AckBehindHead,
    NonMonotonicHeartbeat,
    ProtocolError,
    TableOverflow,
    UnknownFront,
    UnknownSegment,
)
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    Ack,
    AckBatch,
    Flush,
    Heartbeat,
    MinTimeUpdate,
    RegisterFront,
    UnregisterFront,
)
from lowtide.core.time import TIME_LIMIT, TimeGrid
from lowtide.core.tracker import Step, Tracker, TrackerConfig, TrackerSnapshot

SRC, SIDE, MID, SINK = 0, 1, 2, 3
GRAPH = SegmentGraph.of(("src", ()), ("side", ()), ("mid", ("src", "side")), ("sink", ("mid",)))


def snap_key(snap: TrackerSnapshot) -> tuple[Any, ...]:
    """A snapshot as comparable plain data (cells sorted: ring layout is not state)."""
    windows, xors, counts, segments = snap.cells
    order = np.lexsort((windows, segments))
    cells = tuple(
        zip(
            segments[order].tolist(),
            windows[order].tolist(),
            xors[order].tolist(),
            counts[order].tolist(),
            strict=True,
        )
    )
    return (
        snap.graph_fingerprint,
        snap.window_slots,
        tuple(snap.bases.tolist()),
        cells,
        snap.fronts,
        snap.done_bounds,
        snap.min_times,
        snap.global_min,
    )


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def changes(step: Step) -> list[tuple[str | None, int]]:
    return [(u.segment, u.time) for u in step.updates]


def busy_tracker(**config: Any) -> Tracker:
    """Two sources into a merge, window = 2 slots, items in flight, bases moved.

    Announced: src 4 (item b at slot 5 open), side 6, mid 2 (a' and c' at slots 3, 2
    open), sink 2, global 2.
    """
    cfg: dict[str, Any] = {"grid": TimeGrid(window_slots=2), "initial_windows": 4}
    cfg.update(config)
    tr = TrackerConfig(GRAPH, max_windows=64, **cfg).build()
    tr.register_front(RegisterFront(1, "src", 0))
    tr.register_front(RegisterFront(2, "side", 0))
    tr.apply(acks((SRC, 1, 0xA, 1), (SRC, 5, 0xB, 1), (SIDE, 2, 0xC, 1)))
    tr.heartbeat(Heartbeat(1, 8))
    tr.heartbeat(Heartbeat(2, 6))
    tr.apply(acks((MID, 3, 0xA1, 1), (SRC, 1, 0xA, -1)))
    tr.apply(acks((MID, 2, 0xC1, 1), (SIDE, 2, 0xC, -1)))
    step = tr.step(now_ms=0)
    assert changes(step) == [("src", 4), ("side", 6), ("mid", 2), ("sink", 2), (None, 2)]
    return tr


def test_docstring_example_step_by_step() -> None:
    tr = TrackerConfig(SegmentGraph.of(("src", ()), ("out", ("src",)))).build()
    assert tr.min_times() == (0, 0) and tr.min_time() == 0
    tr.register_front(RegisterFront(front=1, segment="src", time=10))
    assert changes(tr.step(0)) == [("src", 10), ("out", 10), (None, 10)]
    tr.apply(acks((0, 10, 0xA, +1)))
    tr.heartbeat(Heartbeat(1, 12))
    assert tr.step(0) == Step()
    tr.apply(acks((1, 10, 0xB, +1)))  # child sent first (rule 2) ...
    assert tr.step(0) == Step()
    tr.apply(acks((0, 10, 0xA, -1)))  # ... then the parent received
    assert changes(tr.step(0)) == [("src", 12)]
    assert tr.bound("out") == 12
    tr.apply(acks((1, 10, 0xB, -1)))
    assert changes(tr.step(0)) == [("out", 12), (None, 12)]
    assert tr.min_time("out") == 12 and tr.min_time() == 12
    assert tr.step(0) == Step()  # nothing new, nothing announced


def test_min_times_are_window_boundaries() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ())), grid=TimeGrid(window_slots=4)).build()
    tr.register_front(RegisterFront(1, "s", 0))
    tr.heartbeat(Heartbeat(1, 7))  # window [4, 8) not fully covered yet
    assert changes(tr.step(0)) == [("s", 4), (None, 4)]
    tr.heartbeat(Heartbeat(1, 8))
    assert changes(tr.step(0)) == [("s", 8), (None, 8)]
    tr.apply(acks((0, 9, 0x1, 1)))
    tr.heartbeat(Heartbeat(1, 100))
    assert tr.step(0) == Step()  # window [8, 12) holds the item at slot 9
    tr.apply(acks((0, 9, 0x1, -1)))
    assert changes(tr.step(0)) == [("s", 100), (None, 100)]


def test_a_merge_waits_for_its_slowest_inbound() -> None:
    tr = TrackerConfig(GRAPH).build()
    tr.register_front(RegisterFront(1, "src", 10))
    tr.register_front(RegisterFront(2, "side", 30))
    assert changes(tr.step(0)) == [("src", 10), ("side", 30), ("mid", 10), ("sink", 10), (None, 10)]
    tr.heartbeat(Heartbeat(1, 40))
    assert changes(tr.step(0)) == [("src", 40), ("mid", 30), ("sink", 30), (None, 30)]
    assert tr.bound("mid") == 30 and tr.bound("src") == 40


def test_global_min_is_over_all_segments() -> None:
    tr = TrackerConfig(GRAPH).build()
    tr.register_front(RegisterFront(1, "src", 10))
    tr.register_front(RegisterFront(2, "side", 10))
    tr.apply(acks((SINK, 12, 0x5, 1)))  # an item still in the sink segment
    tr.heartbeat(Heartbeat(1, 20))
    tr.heartbeat(Heartbeat(2, 20))
    tr.step(0)
    assert tr.min_times() == (20, 20, 20, 12)
    assert tr.min_time() == 12


def test_ack_behind_the_head_is_refused() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ()))).build()
    tr.register_front(RegisterFront(1, "s", 0))
    tr.heartbeat(Heartbeat(1, 12))
    tr.step(0)
    with pytest.raises(AckBehindHead):
        tr.apply(acks((0, 11, 0x1, 1)))
    tr.apply(acks((0, 12, 0x1, 1)))  # at the head: fine
    assert tr.open_windows("s")[0].tolist() == [12]


def test_table_overflow_is_refused() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ())), initial_windows=2, max_windows=8).build()
    tr.apply(acks((0, 7, 0x1, 1)))
    with pytest.raises(TableOverflow):
        tr.apply(acks((0, 8, 0x2, 1)))
    tr.register_front(RegisterFront(1, "s", 0))
    tr.heartbeat(Heartbeat(1, 50))
    tr.apply(acks((0, 7, 0x1, -1)))
    tr.step(0)
    tr.apply(acks((0, 57, 0x2, 1)))  # the limit moves with the head


def test_unknown_segment_names_in_queries() -> None:
    tr = TrackerConfig(GRAPH).build()
    with pytest.raises(UnknownSegment):
        tr.min_time("nope")
    with pytest.raises(UnknownSegment):
        tr.bound("nope")
    with pytest.raises(UnknownSegment):
        tr.open_windows("nope")


def test_register_floor_is_the_announced_min_time() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ()), ("t", ("s",)))).build()
    tr.register_front(RegisterFront(1, "s", 12))
    tr.step(0)
    with pytest.raises(ProtocolError, match="below"):
        tr.register_front(RegisterFront(2, "s", 11))
    tr.register_front(RegisterFront(2, "s", 12))
    with pytest.raises(ProtocolError, match="inbound"):
        tr.register_front(RegisterFront(3, "t", 20))
    assert tr.fronts() == {1: ("s", 12), 2: ("s", 12)}


def test_unregister_lets_the_segment_move_on() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ()))).build()
    tr.register_front(RegisterFront(1, "s", 0))
    tr.register_front(RegisterFront(2, "s", 0))
    tr.heartbeat(Heartbeat(1, 50))
    assert tr.step(0) == Step()
    tr.unregister_front(UnregisterFront(2))
    assert changes(tr.step(0)) == [("s", 50), (None, 50)]
    tr.unregister_front(UnregisterFront(1))
    assert tr.step(0) == Step()  # done at 50: the bound stays
    assert tr.fronts() == {}


def test_apply_flush_applies_acks_then_heartbeats() -> None:
    tr = TrackerConfig(SegmentGraph.of(("s", ()))).build()
    tr.register_front(RegisterFront(1, "s", 0))
    tr.receive_flush(Flush(0, 1, acks((0, 3, 0x1, 1)), (Heartbeat(1, 5), Heartbeat(1, 9))))
    assert changes(tr.step(0)) == [("s", 3), (None, 3)]
    assert tr.fronts() == {1: ("s", 9)}
    tr.apply_flush(acks((0, 3, 0x1, -1)))
    assert changes(tr.step(0)) == [("s", 9), (None, 9)]


def test_empty_inputs_are_no_ops() -> None:
    tr = busy_tracker()
    before = snap_key(tr.snapshot())
    tr.apply(AckBatch.empty())
    tr.apply_flush(AckBatch.empty(), ())
    assert snap_key(tr.snapshot()) == before


# --------------------------------------------------- protocol errors change nothing
good = acks((MID, 6, 0xD1, 1), (SINK, 6, 0xD2, 1))
BAD_INPUTS: list[tuple[str, Callable[[Tracker], object], type[ProtocolError]]] = [
    (
        "register unknown segment",
        lambda t: t.register_front(RegisterFront(9, "nope", 10)),
        UnknownSegment,
    ),
    (
        "register on a non-source",
        lambda t: t.register_front(RegisterFront(9, "mid", 10)),
        ProtocolError,
    ),
    (
        "register below the floor",
        lambda t: t.register_front(RegisterFront(9, "src", 3)),
        ProtocolError,
    ),
    (
        "register on another segment",
        lambda t: t.register_front(RegisterFront(1, "side", 10)),
        ProtocolError,
    ),
    (
        "re-register going back",
        lambda t: t.register_front(RegisterFront(1, "src", 7)),
        NonMonotonicHeartbeat,
    ),
    (
        "register at a negative time",
        lambda t: t.register_front(RegisterFront(9, "src", -1)),
        ProtocolError,
    ),
    ("unregister unknown", lambda t: t.unregister_front(UnregisterFront(9)), UnknownFront),
    ("heartbeat unknown", lambda t: t.heartbeat(Heartbeat(9, 10)), UnknownFront),
    ("heartbeat going back", lambda t: t.heartbeat(Heartbeat(1, 7)), NonMonotonicHeartbeat),
    ("heartbeat at the limit", lambda t: t.heartbeat(Heartbeat(1, TIME_LIMIT)), ProtocolError),
    ("ack segment too big", lambda t: t.apply(acks((MID, 6, 1, 1), (4, 6, 2, 1))), UnknownSegment),
    (
        "ack segment negative",
        lambda t: t.apply(acks((MID, 6, 1, 1), (-1, 6, 2, 1))),
        UnknownSegment,
    ),
    (
        "ack behind the head",
        lambda t: t.apply(acks((SINK, 6, 1, 1), (SRC, 3, 2, -1))),
        AckBehindHead,
    ),
    (
        "ack overflows the table",
        lambda t: t.apply(acks((MID, 6, 1, 1), (MID, 130, 2, 1))),
        TableOverflow,
    ),
    (
        "ack at a negative time",
        lambda t: t.apply(acks((MID, 6, 1, 1), (MID, -2, 2, 1))),
        ProtocolError,
    ),
    ("ack at the time limit", lambda t: t.apply(acks((MID, TIME_LIMIT, 2, 1))), ProtocolError),
    (
        "flush: heartbeat going back",
        lambda t: t.apply_flush(good, [Heartbeat(1, 7)]),
        NonMonotonicHeartbeat,
    ),
    (
        "flush: heartbeats out of order",
        lambda t: t.apply_flush(good, [Heartbeat(1, 20), Heartbeat(1, 15)]),
        NonMonotonicHeartbeat,
    ),
    (
        "flush: unknown front",
        lambda t: t.apply_flush(good, [Heartbeat(2, 9), Heartbeat(9, 20)]),
        UnknownFront,
    ),
    (
        "flush: heartbeat at the limit",
        lambda t: t.apply_flush(good, [Heartbeat(1, TIME_LIMIT)]),
        ProtocolError,
    ),
    (
        "flush: ack behind the head",
        lambda t: t.apply_flush(acks((SRC, 2, 5, 1)), [Heartbeat(1, 20)]),
        AckBehindHead,
    ),
    (
        "receive_flush: bad ack",
        lambda t: t.receive_flush(
            Flush(3, 1, acks((MID, 6, 1, 1), (7, 6, 1, 1)), (Heartbeat(1, 20),))
        ),
        UnknownSegment,
    ),
    (
        "restore another graph",
        lambda t: t.restore(TrackerConfig(SegmentGraph.of(("x", ()))).build().snapshot()),
        ProtocolError,
    ),
    (
        "restore another window size",
        lambda t: t.restore(TrackerConfig(GRAPH, grid=TimeGrid(window_slots=3)).build().snapshot()),
        ProtocolError,
    ),
]


@pytest.mark.parametrize(("name", "call", "error"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_protocol_errors_leave_the_state_unchanged(
    name: str, call: Callable[[Tracker], object], error: type[ProtocolError]
) -> None:
    tr = busy_tracker()
    reference = busy_tracker()
    before = snap_key(tr.snapshot())
    with pytest.raises(error):
        call(tr)
    assert snap_key(tr.snapshot()) == before, name
    # and the tracker goes on exactly like one that never saw the bad input
    for t in (tr, reference):
        t.apply(acks((MID, 3, 0xA1, -1), (MID, 2, 0xC1, -1), (SINK, 4, 0xE, 1)))
    assert changes(tr.step(1)) == changes(reference.step(1)) == [("mid", 4), ("sink", 4), (None, 4)]
    assert snap_key(tr.snapshot()) == snap_key(reference.snapshot())


def test_every_error_is_a_value_error_subclass_of_protocol_error() -> None:
    for _, _, error in BAD_INPUTS:
        assert issubclass(error, ProtocolError) and issubclass(error, ValueError)


# ------------------------------------------------------------ snapshot / restore
def drive(tr: Tracker, script: list[tuple[str, Any]], now: int) -> list[list[MinTimeUpdate]]:
    out = []
    for kind, arg in script:
        if kind == "acks":
            tr.apply(acks(*arg))
        elif kind == "hb":
            tr.heartbeat(Heartbeat(*arg))
        elif kind == "register":
            tr.register_front(RegisterFront(*arg))
        elif kind == "unregister":
            tr.unregister_front(UnregisterFront(arg))
        out.append(list(tr.step(now).updates))
    return out


SECOND_HALF: list[tuple[str, Any]] = [
    ("acks", [(SINK, 5, 0xB1, 1), (SRC, 5, 0xB, -1)]),
    ("hb", (1, 30)),
    ("acks", [(MID, 3, 0xA1, -1)]),
    ("acks", [(MID, 2, 0xC1, -1)]),
    ("register", (3, "side", 6)),
    ("hb", (2, 40)),
    ("acks", [(SINK, 5, 0xB1, -1), (SIDE, 20, 0xF, 1)]),
    ("unregister", 3),
    ("acks", [(MID, 21, 0xF1, 1), (SIDE, 20, 0xF, -1)]),
    ("acks", [(MID, 21, 0xF1, -1)]),
    ("hb", (1, 41)),
]


@pytest.mark.parametrize("initial_windows", [1, 4, 64])
def test_snapshot_restore_round_trip_continues_identically(initial_windows: int) -> None:
    original = busy_tracker()
    snap = original.snapshot()
    restored = TrackerConfig(
        GRAPH, grid=TimeGrid(window_slots=2), initial_windows=initial_windows, max_windows=64
    ).build()
    restored.restore(snap)
    assert snap_key(restored.snapshot()) == snap_key(snap)
    assert restored.min_times() == original.min_times() == (4, 6, 2, 2)
    assert restored.min_time() == 2
    assert restored.fronts() == original.fronts()
    a = drive(original, SECOND_HALF, now=1)
    b = drive(restored, SECOND_HALF, now=1)
    assert a == b
    assert [u for step in a for u in step][-2:] == [
        MinTimeUpdate("sink", 40),
        MinTimeUpdate(None, 40),
    ]
    assert snap_key(original.snapshot()) == snap_key(restored.snapshot())
    # the snapshot is plain data: restoring it twice is the same as once
    restored.restore(snap)
    restored.restore(snap)
    assert snap_key(restored.snapshot()) == snap_key(snap)


def test_snapshot_does_not_alias_the_live_table() -> None:
    tr = busy_tracker()
    snap = tr.snapshot()
    key = snap_key(snap)
    tr.apply(acks((MID, 3, 0xA1, -1)))
    tr.heartbeat(Heartbeat(1, 50))
    tr.step(0)
    assert snap_key(snap) == key


def test_shard_engine_keeps_windows_until_released() -> None:
    tr = Tracker(TrackerConfig(SegmentGraph.of(("s", ()))), release_on_advance=False)
    tr.register_front(RegisterFront(1, "s", 0))
    tr.heartbeat(Heartbeat(1, 10))
    tr.step(0)
    assert tr.min_time("s") == 10
    tr.apply(acks((0, 4, 0x1, 1)))  # late ack below its own min time: accepted ...
    tr.step(0)
    assert tr.min_time("s") == 4  # ... and the engine's min time goes down
    # the floor for new fronts is the released base, not the engine's min time
    tr.register_front(RegisterFront(2, "s", 0))
    tr.unregister_front(UnregisterFront(2))
    tr.apply(acks((0, 4, 0x1, -1)))
    tr.release([8])
    with pytest.raises(AckBehindHead):
        tr.apply(acks((0, 7, 0x2, 1)))
    with pytest.raises(ProtocolError):
        tr.register_front(RegisterFront(3, "s", 7))


def test_a_snapshot_too_wide_for_this_tracker_is_refused_without_damage() -> None:
    """Regression: restore used to wipe the table before finding that a cell did not fit
    (a snapshot from a tracker of the same graph and grid but a larger max_windows)."""
    graph = SegmentGraph.of(("s", ()))
    wide = TrackerConfig(graph, max_windows=1024).build()
    wide.apply(acks((0, 500, 0x1, 1)))
    narrow = TrackerConfig(graph, initial_windows=16, max_windows=64).build()
    narrow.register_front(RegisterFront(1, "s", 0))
    narrow.apply(acks((0, 3, 0x7, 1)))
    narrow.heartbeat(Heartbeat(1, 10))
    narrow.step(0)
    before = snap_key(narrow.snapshot())
    with pytest.raises(TableOverflow):
        narrow.restore(wide.snapshot())
    assert snap_key(narrow.snapshot()) == before
    assert narrow.open_windows("s")[0].tolist() == [3]
