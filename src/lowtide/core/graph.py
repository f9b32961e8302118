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
from collections.abc import Iterable
from dataclasses import dataclass

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
                raise GraphError(f"segment {spec.name!r} is declared twice")
            by_name[spec.name] = spec
        for spec in parsed:
            for up in spec.inbound:
                if up not in by_name:
                    raise GraphError(f"segment {spec.name!r} names unknown inbound {up!r}")
        order = _topological(parsed)
        index = {name: i for i, name in enumerate(order)}
        inbound = tuple(tuple(sorted(index[u] for u in set(by_name[n].inbound))) for n in order)
        return cls(tuple(order), inbound)

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise UnknownSegment(f"unknown segment {name!r}; known: {list(self.names)}") from None

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
    """Kahn's algorithm, stable in declaration order so indices are reproducible."""
    pending = {s.name: set(s.inbound) for s in specs}
    order: list[str] = []
    while pending:
        ready = [s.name for s in specs if s.name in pending and not pending[s.name]]
        if not ready:
            raise GraphError(f"segments form a cycle: {sorted(pending)}")
        for name in ready:
            del pending[name]
            order.append(name)
        for ups in pending.values():
            ups.difference_update(ready)
    return order
