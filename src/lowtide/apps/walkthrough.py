"""A pure-core walk-through: four fronts, one lagging, a three-segment pipeline, and
one item lost on the way. Prints how each segment's min time moves and what the
tracker says about the window that never completes. No Spark, no sockets.

Run it with `lowtide walkthrough`; `lowtide demo` is the Spark demo.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTracker, LocalTrackerConfig
from lowtide.core.messages import I64, U64, AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig

GRAPH = SegmentGraph.of(("ingest", ()), ("parse", ("ingest",)), ("sink", ("parse",)))
GRID = TimeGrid(delta_ms=10, window_slots=10)  # 100 ms tracking windows


LAGGING_FRONT = 3
NORMAL_DELAY_MS = 20  # from a front's label to the parse operator, but for the lagging one


def run(seconds: int, lag_ms: int, lose_at_ms: int | None) -> dict[str, object]:
    # Stuck means open for longer than any normal lag: twice the lagging front's delay,
    # and at least twice the other fronts' (a window is open that long in normal flow)
    tracker = TrackerConfig(GRAPH, GRID, stuck_after_ms=2 * max(lag_ms, NORMAL_DELAY_MS)).build()
    local = LocalTrackerConfig(GRID, max_age_ms=5).build(node=0)
    for f in range(4):
        tracker.register_front(RegisterFront(f, "ingest", 0))
    in_transit: list[tuple[int, I64, U64]] = []  # (due_ms, times, acks) on the way to parse
    print(f"{'t ms':>6}  " + "  ".join(f"{n:>8}" for n in GRAPH.names) + "  global")
    for now_ms in range(0, seconds * 1000, 10):
        in_transit += emit(local, now_ms, lag_ms)
        due = [p for p in in_transit if p[0] <= now_ms]
        in_transit = [p for p in in_transit if p[0] > now_ms]
        for due_ms, times, acks in due:
            lose = lose_at_ms is not None and due_ms >= lose_at_ms
            relay(local, now_ms, times, acks, lose)
            lose_at_ms = None if lose else lose_at_ms
        flush = local.poll(now_ms)
        if flush is not None:
            tracker.receive_flush(flush)
        tracker.step(now_ms)
        if now_ms % 500 == 0:
            mins = "  ".join(f"{tracker.min_time(n):>8}" for n in GRAPH.names)
            print(f"{now_ms:>6}  {mins}  {tracker.min_time():>6}")
    stuck = tracker.stuck()
    for s in stuck:
        print("stuck:", s.describe())
    return {
        "bench": "walkthrough",
        "last_slot": GRID.slot_of(seconds * 1000 - 10),
        "min_times": dict(zip(GRAPH.names, tracker.min_times(), strict=True)),
        "stuck": [s.describe() for s in stuck],
    }


def emit(local: LocalTracker, now_ms: int, lag_ms: int) -> list[tuple[int, I64, U64]]:
    """Each front labels 5 items per 10 ms, acks them into "ingest" and heartbeats;
    the items reach the parse operator 20 ms later (the lagging front: ``lag_ms``)."""
    slot, out = GRID.slot_of(now_ms), []
    for f in range(4):
        seq = np.arange(5, dtype=np.uint64) + np.uint64(now_ms // 10 * 5)
        acks, times = root_acks(f, seq), np.full(5, slot, np.int64)
        local.add_acks(AckBatch.from_columns(0, times, acks, 1), now_ms)
        local.add_heartbeat(Heartbeat(f, slot + 1), now_ms)
        out.append((now_ms + (lag_ms if f == LAGGING_FRONT else NORMAL_DELAY_MS), times, acks))
    return out


def relay(local: LocalTracker, now_ms: int, times: I64, acks: U64, lose: bool) -> None:
    """The parse and sink operators forward items one segment on, children first.
    With ``lose``, one item sent into "parse" never reaches the sink: a loss in flight."""
    zeros = np.zeros(len(acks), np.uint64)
    parsed = child_acks(acks, 1, zeros)
    committed = child_acks(parsed, 2, zeros)
    local.add_acks(AckBatch.from_columns(1, times, parsed, 1), now_ms)  # parse: send on,
    local.add_acks(AckBatch.from_columns(0, times, acks, -1), now_ms)  # then ack receipt
    keep = np.ones(len(acks), bool)
    keep[0] = not lose
    t, p, c = times[keep], parsed[keep], committed[keep]
    local.add_acks(AckBatch.from_columns(2, t, c, 1), now_ms)  # sink: write
    local.add_acks(AckBatch.from_columns(1, t, p, -1), now_ms)  # receipt from parse
    local.add_acks(AckBatch.from_columns(2, t, c, -1), now_ms)  # commit


def seconds_to_report(lose_at_ms: int, lag_ms: int) -> int:
    """Simulated seconds that show the loss reported: its window stops at its bound
    about when the item is lost, and is stuck 2 x the lag later; then a second more."""
    return max(5, (max(lose_at_ms, 0) + 2 * max(lag_ms, NORMAL_DELAY_MS)) // 1000 + 2)


def main(args: argparse.Namespace) -> int:
    seconds = args.seconds or seconds_to_report(args.lose_at_ms, args.lag_ms)
    figures = run(seconds, args.lag_ms, None if args.lose_at_ms < 0 else args.lose_at_ms)
    print(json.dumps(figures))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seconds", type=int, default=0,
        help="simulated seconds (default: long enough to report the lost item, 5 or more)",
    )
    p.add_argument("--lag-ms", type=int, default=1_000, help="delay of the lagging front")
    p.add_argument(
        "--lose-at-ms", type=int, default=2_000, help="lose one item sent at this time (-1: none)"
    )
    p.set_defaults(handler=main)


def register(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(
        sub.add_parser(
            "walkthrough", help="walk through the tracker on a simulated pipeline (no Spark)"
        )
    )
