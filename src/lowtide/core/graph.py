"""The pipeline's segments, declared by name with their inbound segments.

Segments are indexed in a topological order (inbound before outbound); that index is
what acks carry on the hot path and what the local tracker sorts by (rule 2).

>>> g = SegmentGraph.of(("parse", ()), ("filter", ("parse",)), ("sink", ("filter",)))
>>> g.names
('parse', 'filter', 'sink')
>>> g.index("sink"), g.inbound[2], g.is_source(0)
(2, (1,), True)

Cycles (rule 11). Segments that reach each other form a *component* (a strongly
connected component); the order is topological over components, a component's
segments next to each other. A component shares one min time, bounded by its inbound
segments from outside it; fronts may feed a component that has none.

>>> loop = SegmentGraph.of(("in", ()), ("work", ("in", "retry")), ("retry", ("work",)))
>>> loop.names, loop.members(loop.index("retry")), loop.outside(loop.index("work"))
(('in', 'work', 'retry'), (1, 2), (0,))

Key ranges (rule 15). A segment declared with ``key_ranges=N`` has its acks split into
N key ranges, each row's that of the front it came from (``front_ranges``, stated where
the pipeline is built): range ``r`` of segment ``s`` is acked under the code
``graph.cell(s, r)``, past the segment indices.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from lowtide.core.errors import GraphError, UnknownSegment

#: the most key ranges a segment may have
MAX_KEY_RANGES = 1024


FrontRanges = tuple[tuple[int, tuple[int, ...]], ...]  # (front, the key ranges it feeds)


@dataclass(frozen=True)
class SegmentSpec:
    """``key_ranges``: 0, or the number of key ranges its acks are split into;
    ``front_ranges``: the ranges each listed front feeds (a front not listed feeds
    every range)."""

    name: str
    inbound: tuple[str, ...] = ()
    key_ranges: int = 0
    front_ranges: FrontRanges = ()


@dataclass(frozen=True)
class SegmentGraph:
    """Validated, topologically ordered segments. Build with :meth:`of`."""

    names: tuple[str, ...]
    inbound: tuple[tuple[int, ...], ...]
    key_ranges: tuple[int, ...] = ()  # per segment; () when no segment has ranges
    front_ranges: tuple[FrontRanges, ...] = ()  # per segment; () when none are listed
    #: segments detached by a graph change (rule 16): they keep their index, bound
    #: nothing and take no acks
    detached: tuple[int, ...] = ()
    _by_name: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)
    _members: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False,
                                                  hash=False)
    _outside: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False,
                                                  hash=False)
    _first_cell: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _simple: bool = field(init=False, repr=False, compare=False, hash=False)
    #: built by :meth:`ordered` in another order than :meth:`of` would give
    kept_order: bool = field(default=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # a dict, not tuple.index: lookups stay O(1) in graphs of thousands of segments
        object.__setattr__(self, "_by_name", {n: i for i, n in enumerate(self.names)})
        comp = _components(self.inbound)
        members: dict[int, list[int]] = {}
        for s, c in enumerate(comp):
            members.setdefault(c, []).append(s)
        # once per component, shared by its members: a loop of thousands stays linear
        shared = {c: tuple(ms) for c, ms in members.items()}
        outside = {c: tuple(sorted({u for m in ms for u in self.inbound[m] if comp[u] != c}))
                   for c, ms in members.items()}
        object.__setattr__(self, "_members", tuple(shared[c] for c in comp))
        object.__setattr__(self, "_outside", tuple(outside[c] for c in comp))
        first, nxt = [], len(self.names)
        for n in self.key_ranges or (0,) * len(self.names):
            first.append(nxt)
            nxt += n
        object.__setattr__(self, "_first_cell", (*first, nxt))
        acyclic = len(members) == len(self.names) and \
            not any(s in ups for s, ups in enumerate(self.inbound))
        object.__setattr__(self, "_simple", acyclic and not self.key_ranges)

    @classmethod
    def of(cls, *specs: SegmentSpec | tuple[str, Iterable[str]]) -> SegmentGraph:
        parsed = [
            s if isinstance(s, SegmentSpec) else SegmentSpec(s[0], tuple(s[1])) for s in specs
        ]
        if not parsed:
            raise GraphError("a pipeline needs at least one segment")
        by_name: dict[str, SegmentSpec] = {}
        for spec in parsed:
            if not spec.name:
                raise GraphError("segment names must be non-empty")
            if spec.name in by_name:
                raise GraphError(f"segment {_clip(spec.name)!r} is declared twice")
            _check_ranges(spec)
            by_name[spec.name] = spec
        for spec in parsed:
            for up in spec.inbound:
                if up not in by_name:
                    raise GraphError(
                        f"segment {_clip(spec.name)!r} names unknown inbound {_clip(up)!r}"
                    )
        order = _topological(parsed)
        index = {name: i for i, name in enumerate(order)}
        inbound = tuple(tuple(sorted(index[u] for u in set(by_name[n].inbound))) for n in order)
        ranges = tuple(by_name[n].key_ranges for n in order)
        fronts = tuple(tuple(sorted(by_name[n].front_ranges)) for n in order)
        graph = cls(tuple(order), inbound, ranges if any(ranges) else (),
                    fronts if any(fronts) else ())
        graph._check_cycles_have_no_ranges()
        return graph

    @classmethod
    def ordered(cls, specs: Iterable[SegmentSpec], detached: Iterable[str] = ()
                ) -> SegmentGraph:
        """The graph of ``specs`` in the order given, which must be topological over
        components (a later generation's: its segments keep their indices, rule 16);
        ``detached``: the names of its detached segments."""
        listed = list(specs)
        graph = cls.of(*listed)  # every check of a declaration
        index = {spec.name: i for i, spec in enumerate(listed)}
        by = [graph.index(spec.name) for spec in listed]
        fronts = tuple(graph.front_ranges[i] for i in by) if graph.front_ranges else ()
        out = cls(tuple(index), tuple(tuple(sorted({index[u] for u in spec.inbound}))
                                      for spec in listed),
                  tuple(graph.key_ranges[i] for i in by) if graph.key_ranges else (), fronts,
                  tuple(sorted(index[name] for name in set(detached))),
                  kept_order=out_of(graph, index))
        out._check_order()
        return out

    def _check_order(self) -> None:
        for s in range(len(self.names)):
            members = self.members(s)
            if members != tuple(range(members[0], members[0] + len(members))) or \
                    any(u >= members[0] for u in self.outside(s)):
                raise GraphError(f"segment {_clip(self.names[s])!r} comes before a segment "
                                 "it reads: the order is not topological")
            gone = [u for u in self.inbound[s] if u in self.detached]
            if gone and s not in self.detached:
                raise GraphError(f"segment {_clip(self.names[s])!r} reads detached segment "
                                 f"{_clip(self.names[gone[0]])!r}")

    def spec(self, segment: int) -> SegmentSpec:
        """The declaration of ``segment``, as :meth:`of` takes it."""
        return SegmentSpec(self.names[segment], tuple(self.names[u] for u in
                                                      self.inbound[segment]),
                           self.ranges_of(segment),
                           self.front_ranges[segment] if self.front_ranges else ())

    def is_detached(self, segment: int) -> bool:
        return segment in self.detached

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        found = self._by_name.get(name)
        if found is None:
            known = _some(self.names)
            raise UnknownSegment(f"unknown segment {_clip(name)!r}; known: {known}")
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def is_source(self, segment: int) -> bool:
        return not self.inbound[segment]

    def takes_fronts(self, segment: int) -> bool:
        """Fronts may feed ``segment``: its component has no inbound from outside."""
        return not self._outside[segment]

    def members(self, segment: int) -> tuple[int, ...]:
        """The segments of ``segment``'s component (itself alone outside cycles)."""
        return self._members[segment]

    def outside(self, segment: int) -> tuple[int, ...]:
        """The inbound segments of ``segment``'s component from outside it."""
        return self._outside[segment]

    def is_cyclic(self, segment: int) -> bool:
        return len(self._members[segment]) > 1 or segment in self.inbound[segment]

    @property
    def simple(self) -> bool:
        """No key ranges and no cycles: every segment is its own component."""
        return self._simple

    def ranges_of(self, segment: int) -> int:
        """How many key ranges ``segment``'s acks are split into (0: none)."""
        return self.key_ranges[segment] if self.key_ranges else 0

    def fronts_of(self, segment: int) -> dict[int, frozenset[int]]:
        """Front -> the key ranges it feeds, for the fronts ``segment`` lists."""
        rows = self.front_ranges[segment] if self.front_ranges else ()
        return {f: frozenset(r) for f, r in rows}

    def cells_fed(self, segment: int, front: int) -> tuple[int, ...]:
        """The checksum rows ``front`` sends into in ``segment``: the segment's own, or
        the key ranges it feeds (every range if the segment does not list it).

        >>> g = SegmentGraph.of(SegmentSpec("in", (), 2, ((7, (1,)),)))
        >>> g.cells_fed(0, 7), g.cells_fed(0, 8)
        ((2,), (1, 2))
        """
        n = self.ranges_of(segment)
        if not n:
            return (segment,)
        fed = self.fronts_of(segment).get(front)
        return tuple(self.cell(segment, r) for r in range(n) if fed is None or r in fed)

    @property
    def cell_segments(self) -> tuple[int, ...]:
        """The segment of each checksum row: its own, then its key ranges'."""
        return (*range(len(self.names)),
                *(s for s, n in enumerate(self.key_ranges) for _ in range(n)))

    @property
    def n_cells(self) -> int:
        """Checksum rows: one per segment, then one per key range of each segment."""
        return self._first_cell[-1]

    def cell(self, segment: int, key_range: int) -> int:
        """The code that acks of ``key_range`` of ``segment`` carry."""
        return self._first_cell[segment] + key_range

    def range_name(self, segment: int, key_range: int) -> str:
        """How min times of one key range are named: ``"<segment>#<range>"``."""
        return f"{self.names[segment]}#{key_range}"

    def has_min_time(self, name: str) -> bool:
        """Is ``name`` a segment's or a key range's?"""
        try:
            self.resolve(name)
        except UnknownSegment:
            return False
        return True

    def resolve(self, name: str) -> tuple[int, int | None]:
        """(segment, key range or None) of a segment's or a key range's name."""
        found = self._by_name.get(name)
        if found is not None:
            return found, None
        base, _, tail = name.rpartition("#")
        s = self._by_name.get(base)
        if s is not None and tail.isdigit() and int(tail) < self.ranges_of(s):
            return s, int(tail)
        return self.index(name), None  # raises UnknownSegment

    def sinks(self) -> tuple[int, ...]:
        fed = {u for s, ups in enumerate(self.inbound) for u in ups if u != s}
        return tuple(i for i in range(len(self.names))
                     if i not in fed and i not in self.detached)

    def fingerprint(self) -> str:
        """Stable id of the graph, so peers can check they index segments alike."""
        text = ";".join(
            f"{n}<{','.join(map(str, ups))}"
            for n, ups in zip(self.names, self.inbound, strict=True)
        )
        if self.key_ranges or self.front_ranges:  # graphs without keep their old print
            text += f"|{self.key_ranges}|{self.front_ranges}"
        if self.detached:
            text += f"|detached{self.detached}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _check_cycles_have_no_ranges(self) -> None:
        for s in range(len(self.names)):
            if self.ranges_of(s) and self.is_cyclic(s):
                raise GraphError(f"segment {_clip(self.names[s])!r} is in a cycle and has "
                                 "key ranges: a cycle shares one min time (drop key_ranges)")


def out_of(graph: SegmentGraph, index: dict[str, int]) -> bool:
    """Does ``index`` order the segments otherwise than ``graph`` (:meth:`of`'s)?"""
    return tuple(index) != graph.names


def _check_ranges(spec: SegmentSpec) -> None:
    n = spec.key_ranges
    if n < 0 or n == 1 or n > MAX_KEY_RANGES:
        raise GraphError(f"segment {_clip(spec.name)!r}: key_ranges={n}; use 0 (none) or "
                         f"2..{MAX_KEY_RANGES}")
    for front, ranges in spec.front_ranges:
        if not n:
            raise GraphError(f"segment {_clip(spec.name)!r} lists front ranges but has no "
                             "key_ranges")
        if not ranges or any(not 0 <= r < n for r in ranges):
            raise GraphError(f"segment {_clip(spec.name)!r}: front {front} feeds ranges "
                             f"{list(ranges)}; give one or more of 0..{n - 1}")


def _components(inbound: tuple[tuple[int, ...], ...]) -> list[int]:
    """Each segment's strongly connected component, numbered by its first member
    (Tarjan's algorithm, iterative: deep chains must not hit Python's recursion limit)."""
    n = len(inbound)
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    on_stack, stack, counter = [False] * n, [], 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            ups = inbound[v]
            if i < len(ups):
                work.append((v, i + 1))
                u = ups[i]
                if index[u] < 0:
                    work.append((u, 0))
                elif on_stack[u]:
                    low[v] = min(low[v], index[u])
                continue
            if low[v] == index[v]:
                members = []
                while True:
                    u = stack.pop()
                    on_stack[u] = False
                    members.append(u)
                    if u == v:
                        break
                first = min(members)
                for u in members:
                    comp[u] = first
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp


def _topological(specs: list[SegmentSpec]) -> list[str]:
    """Kahn's algorithm in rounds over the components, stable in declaration order so
    indices are reproducible: a component's round is the length of the longest path
    from a source to it, and the order is (round, first declaration position,
    declaration position). O(segments + edges). Without cycles, every segment is a
    component and the order is what it has always been."""
    position = {s.name: i for i, s in enumerate(specs)}
    names = [s.name for s in specs]
    comp = _components(tuple(tuple(sorted({position[u] for u in s.inbound})) for s in specs))
    first = {c: c for c in comp}  # a component is numbered by its first member
    waiting = dict.fromkeys(first, 0)  # inbound components not yet placed
    outbound: dict[int, set[int]] = {c: set() for c in first}
    for s in specs:
        for up in set(s.inbound):
            a, b = comp[position[up]], comp[position[s.name]]
            if a != b and b not in outbound[a]:
                outbound[a].add(b)
                waiting[b] += 1
    depth = dict.fromkeys(first, 0)
    ready = deque(c for c in first if waiting[c] == 0)
    while ready:
        c = ready.popleft()
        for down in sorted(outbound[c]):
            depth[down] = max(depth[down], depth[c] + 1)
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    return sorted(names, key=lambda n: (depth[comp[position[n]]], first[comp[position[n]]],
                                        position[n]))


def _clip(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[:limit] + "..."


def _some(names: Iterable[str], limit: int = 10) -> str:
    """A few names for an error message: a huge graph must not make a huge message."""
    listed = list(names)
    shown = ", ".join(repr(_clip(n)) for n in listed[:limit])
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return f"[{shown}{more}]"
