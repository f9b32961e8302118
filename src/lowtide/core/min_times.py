"""The min-time layer of a tracker: how far each segment has advanced (rule 4).

One walk over the segments in topological order per step: a segment advances its
checksum head while the windows are complete and end at or below its bound, the
minimum of its inbound segments' min times (or its fronts' bound for a source
segment). A component of a cycle shares one head (rule 11); a segment with key ranges
has one head per range and its min time is their minimum (rule 15). The global min
time is the minimum over the segments.

>>> from lowtide.core.fronts import FrontTable
>>> from lowtide.core.graph import SegmentGraph
>>> from lowtide.core.table import ChecksumTable
>>> g = SegmentGraph.of(("src", ()), ("out", ("src",)))
>>> fronts = FrontTable(2); fronts.register(1, 0, 30, floor=0)
>>> times = MinTimes(g, ChecksumTable(2, 16), fronts, window_slots=10)
>>> [(u.segment, u.time) for u in times.step()]     # windows of 10 slots
[('src', 30), ('out', 30), (None, 30)]
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.core.fronts import FrontTable
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import MinTimeUpdate
from lowtide.core.table import ChecksumTable


class MinTimes:
    """Every segment's, key range's and the global min time, and the walk that moves
    them. ``release``: forget windows as soon as they are complete (a central
    tracker); a shard keeps them until its aggregator releases them."""

    def __init__(self, graph: SegmentGraph, table: ChecksumTable, fronts: FrontTable,
                 window_slots: int, release: bool = True) -> None:
        self.graph, self._table, self._fronts = graph, table, fronts
        self._w, self._release = window_slots, release
        n = len(graph)
        self.mins = [0] * n
        self.limits = [0] * n  # the bound each segment last advanced to, in windows
        # per segment, the min time of each of its key ranges (rule 15; [] without)
        self.range_mins = [[0] * graph.ranges_of(s) for s in range(n)]
        self.range_limits = [[0] * graph.ranges_of(s) for s in range(n)]
        self.global_min = 0
        self._attached: Sequence[int] = range(n)
        # the inputs' versions after the last step: a step is a function of the table,
        # the fronts and the graph, and moves every segment as far as they allow, so a
        # second one with none of them changed moves nothing (an idle tracker's ticks)
        self._stepped: tuple[int, int] | None = None

    def grow(self, graph: SegmentGraph, starts: list[int]) -> None:
        """Take the next generation of the graph (rule 16): attached segments start at
        ``starts`` (window boundaries); detached ones keep their last min time, are no
        longer stepped and no longer count for the global min time."""
        self.graph = graph
        self._stepped = None
        self.mins += starts
        self.limits += [t // self._w for t in starts]
        self.range_mins += [[] for _ in starts]
        self.range_limits += [[] for _ in starts]
        self._attached = [s for s in range(len(graph)) if not graph.is_detached(s)]

    def step(self) -> list[MinTimeUpdate]:
        """Advance every segment as far as its bound and its checksums allow; nothing
        to do when neither the checksums nor the fronts changed since the last step."""
        updates: list[MinTimeUpdate] = []
        if self._stepped == (self._table.version, self._fronts.version):
            return updates
        if self.graph.simple:
            for s in self._attached:
                limit = self.bound(s) // self._w
                self._announce((s,), self._advance(s, limit), limit, updates)
        else:
            self._step_components(updates)
        low = min(self.mins[s] for s in self._attached)
        if low != self.global_min:
            self.global_min = low
            updates.append(MinTimeUpdate(None, low))
        self._stepped = (self._table.version, self._fronts.version)  # after its releases
        return updates

    def _advance(self, cell: int, limit: int) -> int:
        """The head of one checksum row (a segment or a key range), released if central."""
        head = self._table.first_open(cell, limit)
        if self._release:
            self._table.release(cell, head)
        return head

    def _announce(self, segments: tuple[int, ...], head: int, limit: int,
                  updates: list[MinTimeUpdate]) -> None:
        time = head * self._w
        for s in segments:
            self.limits[s] = limit
            if time != self.mins[s]:
                self.mins[s] = time
                updates.append(MinTimeUpdate(self.graph.names[s], time))

    def _step_components(self, updates: list[MinTimeUpdate]) -> None:
        """The step of a graph with cycles or key ranges: a component shares one head
        (rule 11), a segment with key ranges has one per range (rule 15)."""
        g, s = self.graph, 0
        while s < len(g):
            members = g.members(s)
            if g.is_detached(s):  # frozen where it was detached (rule 16)
                s = members[-1] + 1
                continue
            if g.ranges_of(s):
                self._step_ranges(s, updates)
            else:
                limit = self._component_bound(s) // self._w
                head = min(self._table.first_open(m, limit) for m in members)
                for m in members:
                    if self._release:
                        self._table.release(m, head)
                self._announce(members, head, limit, updates)
            s = members[-1] + 1

    def _step_ranges(self, s: int, updates: list[MinTimeUpdate]) -> None:
        """Each key range of ``s`` advances as far as its own checksums and bound
        allow; the segment's min time is the minimum over its ranges."""
        g, mins, limits = self.graph, self.range_mins[s], self.range_limits[s]
        for r in range(len(mins)):
            limits[r] = self._range_bound(s, r) // self._w
            time = self._advance(g.cell(s, r), limits[r]) * self._w
            if time != mins[r]:
                mins[r] = time
                updates.append(MinTimeUpdate(g.range_name(s, r), time))
        head = min(mins) // self._w
        if self._release:
            self._table.release(s, head)  # nothing is acked into the segment's own row
        self._announce((s,), head, min(limits), updates)

    def bound(self, s: int) -> int:
        inbound = self.graph.inbound[s]
        if not inbound:
            return self._fronts.bound(s)
        return min(self.mins[u] for u in inbound)

    def _component_bound(self, s: int) -> int:
        """The bound of ``s``'s component: its fronts', or its outside inbound's."""
        outside = self.graph.outside(s)
        if not outside:
            return self._fronts.bound_of(self.graph.members(s), lambda f: True)
        return min(self.mins[u] for u in outside)

    def _range_bound(self, s: int, r: int) -> int:
        """The bound of key range ``r`` of ``s``: the fronts that feed it, or the same
        range of each inbound segment split alike (the whole segment otherwise)."""
        g = self.graph
        if not g.inbound[s]:
            listed = g.fronts_of(s)
            return self._fronts.bound_of((s,), lambda f: f not in listed or r in listed[f])
        n = g.ranges_of(s)
        return min(self.range_mins[u][r] if g.ranges_of(u) == n else self.mins[u]
                   for u in g.inbound[s])

    def floor(self, s: int, front: int) -> int:
        """The earliest time a new front may start at: what was announced for ``s``
        (for each key range the front feeds); a shard's, what its aggregator released
        (its table's bases: they survive a restart)."""
        g = self.graph
        if not self._release:
            return max(self._table.base(c) * self._w for c in g.cells_fed(s, front))
        if not g.ranges_of(s):
            return self.mins[s]
        return max(self.range_mins[s][c - g.cell(s, 0)] for c in g.cells_fed(s, front))

    def restore(self, min_times: tuple[int, ...], global_min: int) -> None:
        """Announced min times from a snapshot (its table loaded already)."""
        self.mins, self.global_min = list(min_times), global_min
        self._stepped = None
        # a central tracker released each key range up to its announced min time
        self.range_mins = [[self._table.base(self.graph.cell(s, r)) * self._w
                            for r in range(len(rm))] for s, rm in enumerate(self.range_mins)]
