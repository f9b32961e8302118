"""Key ranges in Spark (rule 15): which range a row is in, and the codes its acks carry.

A segment split into key ranges is fed by fronts that partition the keys: the source
segment lists the range each front feeds (``SegmentSpec.front_ranges``), and every
segment between it and the keyed step is split alike. A row's range is its front's,
read from its ``front`` column (:data:`RANGE_COL`) through that listing, so a row is
sent and received in the same range at every step; a step that moved a row to another
range would leave one range's checksum open (a stuck window, never an early one).

>>> from lowtide.core.graph import SegmentGraph, SegmentSpec
>>> g = SegmentGraph.of(SegmentSpec("keep", (), 2, ((0, (0,)), (1, (1,)), (7, (0,)))),
...                     SegmentSpec("win", ("keep",), 2), ("sink", ("win",)))
>>> row_ranges(g, g.index("win"), np.array([7, 1, 0]))
array([0, 1, 0])
>>> front_cell(g, "keep", 1) == g.cell(g.index("keep"), 1)
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lowtide.core.graph import SegmentGraph

# the column a row's key range comes from: its front's
RANGE_COL = "front"
#: the least and the greatest key range of a (key, window)'s rows, where Spark's JVM
#: aggregates a window with key ranges (lowtide.spark.operators.window_driver)
RANGE_LO, RANGE_HI = "lt_range_lo", "lt_range_hi"


def source_ranges(graph: SegmentGraph, s: int) -> dict[int, int]:
    """Front -> the one range it feeds, listed by the source segment of ``s``'s split
    chain (``s`` itself, or the segment its ranged inbound chain starts at)."""
    n = graph.ranges_of(s)
    while graph.inbound[s] and graph.ranges_of(graph.inbound[s][0]) == n:
        s = graph.inbound[s][0]
    return {f: min(r) for f, r in graph.fronts_of(s).items() if len(r) == 1}


def row_ranges(graph: SegmentGraph, s: int, fronts: np.ndarray) -> np.ndarray:
    """The key range of each row of segment ``s``, from its front; a row of a front
    the source does not list has no range (a ``ValueError``: it would be acked in no
    range, or in one its keys are not in)."""
    listed = source_ranges(graph, s)
    fronts = np.asarray(fronts, np.int64)
    ids = np.array(sorted(listed) or [-1], np.int64)
    at = np.searchsorted(ids, fronts).clip(0, len(ids) - 1)
    known = ids[at] == fronts
    if not known.all():
        bad = sorted(set(fronts[~known].tolist()))[:5]
        raise ValueError(f"rows of front(s) {bad} reach {graph.names[s]!r}, split into key "
                         f"ranges, but no range is listed for them: list every front "
                         f"(fronts= of the source, or front_ranges= of the window)")
    return np.array([listed.get(f, -1) for f in ids.tolist()], np.int64)[at]


def front_range(graph: SegmentGraph, segment: str, front: int) -> int | None:
    """The key range ``front`` feeds in ``segment`` (None: the segment has none)."""
    if not graph.ranges_of(graph.index(segment)):
        return None
    ranges = sorted(graph.fronts_of(graph.index(segment)).get(front, ()))
    if len(ranges) != 1:
        raise ValueError(f"front {front} feeds key ranges {ranges} of {segment!r}: each "
                         "front of a segment split into key ranges feeds one")
    return ranges[0]


def front_cell(graph: SegmentGraph, segment: str, front: int) -> int:
    """What a front's send-acks into ``segment`` carry: the segment, or, in a segment
    split into key ranges, the range the front feeds."""
    r = front_range(graph, segment, front)
    return graph.index(segment) if r is None else graph.cell(graph.index(segment), r)


Step = Callable[[Any, int, int], Any]  # (Arrow batch, in code, out code) -> output batch


def by_range(graph: SegmentGraph, in_idx: int, out_idx: int, batch: Any, step: Step) -> Any:
    """``step`` on ``batch``, or, where ``in_idx`` is split into key ranges, on the rows
    of each range with that range's codes in and out (rows keep their range: an
    output row of another range is refused)."""
    import pyarrow as pa

    n = graph.ranges_of(in_idx)
    if not n or not batch.num_rows:
        return step(batch, in_idx, out_idx)
    ranges = batch_ranges(graph, in_idx, batch)
    outs = []
    for r in np.unique(ranges).tolist():
        out_code = graph.cell(out_idx, r) if graph.ranges_of(out_idx) == n else out_idx
        out = step(batch.filter(pa.array(ranges == r)), graph.cell(in_idx, r), out_code)
        _check_kept(graph, in_idx, out, r)
        outs.append(out)
    return pa.concat_batches(outs)


def batch_ranges(graph: SegmentGraph, idx: int, batch: Any) -> np.ndarray:
    """The key range of each row of an Arrow ``batch`` of segment ``idx`` (split into
    key ranges), from its ``front`` column."""
    names = batch.schema.names
    if RANGE_COL not in names:
        raise ValueError(f"{graph.names[idx]!r} is split into key ranges but its rows "
                         f"have no {RANGE_COL!r} column")
    return row_ranges(graph, idx, batch.column(names.index(RANGE_COL)).to_numpy())


def range_cells(graph: SegmentGraph, idx: int, batch: Any) -> np.ndarray:
    """The cell of each row of ``batch`` in segment ``idx``, split into key ranges: its
    key range's. (A segment not split has one cell, its own: callers ack it whole, with
    no pass over the rows.)"""
    return graph.cell(idx, 0) + batch_ranges(graph, idx, batch)


def require_front(what: str, columns: Any) -> None:
    """A step split into key ranges (``what``, e.g. "window 'w'") reads each row's range
    from its ``front`` column: refused where the query is described without it."""
    if RANGE_COL not in columns:
        raise ValueError(f"{what}: key_ranges needs the rows' {RANGE_COL!r} column (a "
                         "row's key range is its front's)")


def _check_kept(graph: SegmentGraph, in_idx: int, out: Any, r: int) -> None:
    if not out.num_rows or RANGE_COL not in out.schema.names:
        return  # a step that drops the column is refused where the plan is built
    got = row_ranges(graph, in_idx, out.column(out.schema.names.index(RANGE_COL)).to_numpy())
    if (got != r).any():
        raise ValueError(f"the step receiving from {graph.names[in_idx]!r} moved rows from "
                         f"key range {r} to {sorted(set(got.tolist()) - {r})}: keep each "
                         f"row's {RANGE_COL!r} (its range) as it came")
