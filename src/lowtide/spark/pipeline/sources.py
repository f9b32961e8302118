"""Where a pipeline's streams come from: each source's spec, and the fronts declared
with it (held by the tracker until they register, rule 17)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.spark.sources.generator import GeneratorSpec


@dataclass(frozen=True)
class DeclaredFronts:
    """The fronts that feed a source's ingest segment, declared with the pipeline: the
    tracker holds the segment for each until it registers (a producer that starts
    late), or until ``retire_after_ms`` passed (None: until retired by hand)."""

    ids: tuple[int, ...]
    retire_after_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("fronts=: name at least one front id (or leave it out)")
        if any(f < 0 for f in self.ids):
            raise ValueError(f"fronts=: front ids are >= 0, got {list(self.ids)}")
        if self.retire_after_ms is not None and self.retire_after_ms < 0:
            raise ValueError("retire_after_ms must be >= 0 (None: never)")


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "log" | "gen" | "frame" (a labelled streaming DataFrame: read_stream)
    name: str | None  # ingest segment name (log, frame) or None (the generator is the front)
    options: dict[str, str]
    spec: GeneratorSpec | None = None
    frame: Any = None  # kind "frame": the user's streaming DataFrame
    fronts: DeclaredFronts | None = None


def declare_fronts(sources: list[SourceSpec], agent: Any, graph: SegmentGraph,
                   pipeline: str) -> None:
    """Declare the fronts each source listed (owner ``lowtide-pipeline:<pipeline>``).
    A front that feeds several reads of one log registers on the k-th of them as
    ``front + k * CONSUMER_STRIDE`` (``Pipeline.front``), and is declared so."""
    from lowtide.spark.sources.front import CONSUMER_STRIDE

    for src in sources:
        segment = src.name or "ingest"
        if src.fronts is None or src.kind == "gen" or segment not in graph:
            continue
        stride = 0
        if src.kind == "log":
            same = [s for s in sources
                    if s.kind == "log" and s.options["path"] == src.options["path"]]
            stride = same.index(src) * CONSUMER_STRIDE
        for front in src.fronts.ids:
            agent.declare_front(front + stride, segment, owner=f"lowtide-pipeline:{pipeline}",
                                retire_after_ms=src.fronts.retire_after_ms)
