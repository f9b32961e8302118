"""The pipeline's segments, declared by name with their inbound segments.

Segments are indexed in a topological order (inbound before outbound); that index is
what acks carry on the hot path and what the local tracker sorts by (rule 2).

>>> g = SegmentGraph.of(("parse", ()), ("filter", ("parse",)), ("sink", ("filter",)))
>>> g.names
('parse', 'filter', 'sink')
>>> g.index("sink"), g.inbound[2], g.is_source(0)
(2, (1,), True)
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from lowtide.core.errors import GraphError, UnknownSegment


@dataclass(frozen=True)
class SegmentSpec:
    name: str
    inbound: tuple[str, ...] = ()


@dataclass(frozen=True)
class SegmentGraph:
    """Validated, topologically ordered segments. Build with :meth:`of`."""

    names: tuple[str, ...]
    inbound: tuple[tuple[int, ...], ...]
    _by_name: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # a dict, not tuple.index: lookups stay O(1) in graphs of thousands of segments
        object.__setattr__(self, "_by_name", {n: i for i, n in enumerate(self.names)})

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
        return cls(tuple(order), inbound)

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

    def sinks(self) -> tuple[int, ...]:
        fed = {u for ups in self.inbound for u in ups}
        return tuple(i for i in range(len(self.names)) if i not in fed)

    def fingerprint(self) -> str:
        """Stable id of the graph, so peers can check they index segments alike."""
        text = ";".join(
            f"{n}<{','.join(map(str, ups))}"
            for n, ups in zip(self.names, self.inbound, strict=True)
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _topological(specs: list[SegmentSpec]) -> list[str]:
    """Kahn's algorithm in rounds, stable in declaration order so indices are
    reproducible: a segment's round is the length of the longest path from a source
    to it, and the order is (round, declaration position). O(segments + edges)."""
    position = {s.name: i for i, s in enumerate(specs)}
    waiting = {s.name: len(set(s.inbound)) for s in specs}  # inbound not yet placed
    outbound: dict[str, list[str]] = {s.name: [] for s in specs}
    for s in specs:
        for up in set(s.inbound):
            outbound[up].append(s.name)
    depth = dict.fromkeys(waiting, 0)
    ready = deque(name for name, n in waiting.items() if n == 0)
    placed = 0
    while ready:
        name = ready.popleft()
        placed += 1
        for down in outbound[name]:
            depth[down] = max(depth[down], depth[name] + 1)
            waiting[down] -= 1
            if waiting[down] == 0:
                ready.append(down)
    if placed < len(specs):
        cyclic = [name for name, n in waiting.items() if n > 0]
        raise GraphError(f"segments form a cycle: {_some(sorted(cyclic))}")
    return sorted(position, key=lambda name: (depth[name], position[name]))


def _clip(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else name[:limit] + "..."


def _some(names: Iterable[str], limit: int = 10) -> str:
    """A few names for an error message: a huge graph must not make a huge message."""
    listed = list(names)
    shown = ", ".join(repr(_clip(n)) for n in listed[:limit])
    more = f" and {len(listed) - limit} more" if len(listed) > limit else ""
    return f"[{shown}{more}]"
