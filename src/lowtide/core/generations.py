"""Graph generations (rule 16): the segment graph changes while the tracker runs.

A change makes the next generation of the graph: segments *attached* (a query's
segments and fronts), *detached* (a query that stops for good) or *replaced* (a new
version of a query's logic on the same segments, resumed from its checkpoint). The
segments of earlier generations keep their indices, so an ack computed under any
generation means the same segment under every later one: attached segments come after
every existing one, in topological order among themselves, and a detached segment
keeps its index, bounds nothing and takes no acks. An existing segment gains no
inbound segment, so no existing min time can go back.

>>> from lowtide.core.graph import SegmentGraph, SegmentSpec
>>> g0 = SegmentGraph.of(("ingest", ()), ("sink", ("ingest",)))
>>> change = GraphChange(1, attach=(SegmentSpec("ingest2", ()),
...                                 SegmentSpec("sink2", ("ingest2",))))
>>> g1 = next_graph(g0, change); g1.names, g1.inbound
(('ingest', 'sink', 'ingest2', 'sink2'), ((), (0,), (), (2,)))
>>> g2 = next_graph(g1, GraphChange(2, detach=("sink", "ingest")))
>>> g2.detached, g2.sinks()
((0, 1), (3,))
"""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.core.errors import GraphError
from lowtide.core.graph import SegmentGraph, SegmentSpec


@dataclass(frozen=True)
class GraphChange:
    """The change that makes generation ``generation`` (the previous one + 1).
    ``start``: the time attached segments start at, the lowest time their query
    reads (None: the global min time when the change applies)."""

    generation: int
    attach: tuple[SegmentSpec, ...] = ()
    detach: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()
    start: int | None = None


@dataclass(frozen=True)
class DetachedSegment:
    """A segment detached with items in flight: ``(start, end, count)`` per window
    open when it was detached (they are no longer tracked anywhere)."""

    segment: str
    in_flight: tuple[tuple[int, int, int], ...]

    def describe(self) -> str:
        items = sum(abs(c) for _s, _e, c in self.in_flight)
        return (f"segment {self.segment!r} detached with {items} item(s) in flight in "
                f"{len(self.in_flight)} window(s) from time {self.in_flight[0][0]}"
                if self.in_flight else f"segment {self.segment!r} detached, nothing in flight")


def next_graph(graph: SegmentGraph, change: GraphChange) -> SegmentGraph:
    """The graph after ``change``, or :class:`GraphError` with what to fix."""
    if graph.key_ranges or any(spec.key_ranges for spec in change.attach):
        raise GraphError("a graph with key ranges cannot change while the tracker runs "
                         "yet: restart the tracker with the new graph")
    live = {graph.names[s] for s in range(len(graph)) if not graph.is_detached(s)}
    for name in (*change.detach, *change.replace):
        if name not in live:
            raise GraphError(f"segment {name!r} is not attached: cannot detach or replace it")
    if set(change.detach) & set(change.replace):
        raise GraphError("a segment is either detached or replaced, not both")
    for spec in change.attach:
        if spec.name in graph:
            raise GraphError(f"segment {spec.name!r} exists (or existed) in this graph: "
                             "attach it under a new name")
    if not change.attach and len(set(change.detach)) >= len(live):
        raise GraphError("a change may not detach every segment: stop the tracker instead")
    new = SegmentGraph.of(*change.attach, *(graph.spec(s) for s in range(len(graph)))) \
        if change.attach else graph
    added = [new.spec(new.index(n)) for n in new.names if n not in graph]
    specs = [graph.spec(s) for s in range(len(graph))] + added
    detached = {graph.names[s] for s in graph.detached} | set(change.detach)
    return SegmentGraph.ordered(specs, detached)


def start_times(graph: SegmentGraph, mins: list[int], start: int) -> list[int]:
    """Where each segment attached in ``graph`` starts (``mins``: the min times of the
    segments before them): at ``start``, or lower where a segment it reads is (what
    that one still sends may be as old).

    >>> g = SegmentGraph.of(("in", ()), ("out", ("in",)))
    >>> g1 = next_graph(g, GraphChange(1, attach=(SegmentSpec("audit", ("in",)),
    ...                                           SegmentSpec("in2", ()))))
    >>> g1.names[2:], start_times(g1, [100, 90], start=500)
    (('in2', 'audit'), [500, 100])
    """
    times = [*mins]
    for s in range(len(mins), len(graph)):
        times.append(min([start] + [times[u] for u in graph.inbound[s] if u < s]))
    return times[len(mins):]


def follows(old: SegmentGraph, new: SegmentGraph) -> bool:
    """Can ``new`` be a later generation of ``old``: the same segments at the same
    indices (more may follow), none of ``old``'s detached ones attached again?"""
    n = len(old)
    return (new.names[:n] == old.names and new.inbound[:n] == old.inbound
            and set(old.detached) <= set(new.detached) and not old.key_ranges
            and not new.key_ranges) or new == old
