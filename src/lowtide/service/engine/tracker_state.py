"""A core tracker (or a shard's) in the service's terms, for the central and the shard
engines: a front operation applied, the status document, the snapshot as JSON-able
metadata and named arrays, and whose heartbeats a batch carries."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowtide.core.dead_fronts import DeadFront
from lowtide.core.diagnostics import StuckWindow
from lowtide.core.fronts import Declared
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import DeclareFront, RegisterFront, RetireFront, UnregisterFront
from lowtide.core.sharding import TrackerShard
from lowtide.core.tracker import Tracker, TrackerSnapshot
from lowtide.service.progress import utc_text
from lowtide.wire.messages import Batch, FrontAction, FrontOp, graph_of, graph_spec


def flush_session(msg: Batch) -> int | None:
    """Whose own heartbeats a batch carries: its session's for a fire-and-forget flush
    (bound to the session holding their fronts), None for a keyed batch (a Spark task
    heartbeating for its driver proves the owner only)."""
    return None if msg.key else msg.session


def apply_front_op(tracker: Tracker | TrackerShard, msg: FrontOp, now_ms: int = 0) -> None:
    """``now_ms``: the request's clock (a declaration's deadline counts from it)."""
    if msg.action == FrontAction.REGISTER:
        tracker.register_front(
            RegisterFront(msg.front, msg.segment, msg.time, msg.owner, msg.session), now_ms)
    elif msg.action == FrontAction.UNREGISTER:
        tracker.unregister_front(UnregisterFront(msg.front, msg.owner, msg.session), now_ms)
    elif msg.action == FrontAction.DECLARE:
        after = None if msg.retire_after_ms < 0 else msg.retire_after_ms
        tracker.declare_front(
            DeclareFront(msg.front, msg.segment, msg.time, msg.owner, after), now_ms)
    else:
        tracker.retire_front(RetireFront(msg.front, msg.owner))


def tracker_status(tracker: Tracker, graph: SegmentGraph) -> dict[str, Any]:
    """Per segment min time, bound and open windows; fronts; stuck windows."""
    segments = []
    stuck = tracker.stuck()
    for name in graph.names:
        windows, _x, counts = tracker.open_windows(name)
        segments.append(
            {
                "segment": name,
                "min_time": tracker.min_time(name),
                "bound": tracker.bound(name),
                "open_windows": len(windows),
                "in_flight": int(counts.sum()),
                "stuck_windows": sum(1 for w in stuck if w.segment == name),
                # a min time per key range (rule 15); the segment's is their minimum
                "key_ranges": list(tracker.range_min_times(name)),
                "detached": graph.is_detached(graph.index(name)),  # rule 16
            }
        )
    now_ms = tracker.now_ms
    return {
        "global_min": tracker.min_time(None),
        "segments": segments,
        "fronts": {str(f): list(v) for f, v in sorted(tracker.fronts().items())},
        "fronts_declared": {
            str(f): [graph.names[d.segment], d.time, d.retire_at_ms]
            for f, d in sorted(tracker.declared_fronts().items())
        },
        "stuck": [s.describe() for s in stuck],
        "stuck_detail": [stuck_detail(s) for s in stuck],
        "waiting": [w.describe() for w in tracker.waiting()],
        "open_batches": tracker.batches.export(now_ms),
        "batch_ms": tracker.batches.recent_ms(),
        "fronts_dead": {str(d.front): dead_detail(d, graph) for d in tracker.dead_fronts()},
    }


def dead_detail(front: DeadFront, graph: SegmentGraph) -> dict[str, Any]:
    """A dead front the ``wait`` policy waits for, as data: "waits for front F since T"."""
    return {"segment": graph.names[front.segment], "time": front.time,
            "silent_since": utc_text(front.silent_since_ms), "policy": front.policy,
            "text": front.describe(graph.names, utc_text)}


def stuck_detail(window: StuckWindow) -> dict[str, Any]:
    """A stuck window as data (the web view shows its counts): ``missing`` items were
    sent and never received, ``extra`` ones received more often than sent."""
    return {
        "segment": window.segment,
        "window_start": window.window_start,
        "window_end": window.window_end,
        "missing": window.missing,
        "extra": window.extra,
        "since_ms": window.since_ms,
        "text": window.describe(),
    }


def export_tracker(snap: TrackerSnapshot) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    windows, xors, counts, segments = snap.cells
    meta = {
        "fingerprint": snap.graph_fingerprint,
        "window_slots": snap.window_slots,
        "fronts": [list(f) for f in snap.fronts],
        "declared": [[d.front, d.segment, d.time, d.owner, d.retire_at_ms]
                     for d in snap.declared],
        "done_fronts": list(snap.done_fronts),
        "holders": [list(h) for h in snap.holders],
        "seen": [list(r) for r in snap.seen],
        "dead_fronts": [list(r) for r in snap.dead_fronts],
        "done_bounds": list(snap.done_bounds),
        "min_times": list(snap.min_times),
        "global_min": snap.global_min,
        "generation": snap.generation,
        "graph": None if snap.graph is None else graph_spec(snap.graph),
    }
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "bases": snap.bases,
        "windows": windows,
        "xors": xors,
        "counts": counts,
        "segments": segments,
    }
    return meta, arrays


def import_tracker(
    meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]
) -> TrackerSnapshot:
    cells = (
        arrays["windows"].astype(np.int64),
        arrays["xors"].astype(np.uint64),
        arrays["counts"].astype(np.int64),
        arrays["segments"].astype(np.int32),
    )
    return TrackerSnapshot(
        meta["fingerprint"],
        meta["window_slots"],
        arrays["bases"],
        cells,
        tuple((int(f), int(s), int(t), int(o)) for f, s, t, o in meta["fronts"]),
        tuple(meta["done_bounds"]),
        tuple(meta["min_times"]),
        meta["global_min"],
        tuple(Declared(*map(int, d)) for d in meta.get("declared", ())),
        tuple(int(f) for f in meta.get("done_fronts", ())),
        tuple((int(f), int(s), int(t)) for f, s, t in meta.get("holders", ())),
        tuple((int(f), int(t), bool(b)) for f, t, b in meta.get("seen", ())),
        tuple((int(f), int(s), int(o)) for f, s, o in meta.get("dead_fronts", ())),
        int(meta.get("generation", 0)),
        None if meta.get("graph") is None else graph_of(meta["graph"]),
    )
