"""The segment graph of a pipeline description: sources, steps, unions and sinks.

A segment is named after its receiver: a tracked step (its name; a window adds its
state segment), a sink (its name), or a log source (its ingest segment). Walking up
from every sink, each sender (a tracked step or a source) learns the segments it sends
into, and each segment the segments its senders receive from:

* a union is one segment with several senders (rule 11): ``a.union(b).map(f,
  name="m")`` makes ``a``'s and ``b``'s last senders both send into ``m``;
* fan-out is one sender with several segments (rule 11): a stream read by two
  consumers sends each row twice, one copy into each consumer's segment;
* a generator is its own front: its fronts register on the segment it sends into,
  which must then have no tracked sender (a source segment's bound is its fronts').

Errors are raised where the description is wrong, one line each, naming what to
change. The walk reads only the description: no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from lowtide.core.errors import GraphError, LowtideError
from lowtide.core.graph import FrontRanges, SegmentGraph, SegmentSpec
from lowtide.spark.pipeline.sources import SourceSpec

if TYPE_CHECKING:
    from lowtide.spark.pipeline.stream import Stream

#: tracked steps that keep each row's key range (its front) as it came (rule 15)
NARROW_KINDS = ("map", "flat_map", "filter", "where", "explode", "enrich")


class PipelineShapeError(LowtideError, ValueError):
    """The description cannot be tracked as written (names, shape, schemas)."""


@dataclass(frozen=True)
class SegmentPlan:
    """A description's segment graph and who sends into which segment."""

    graph: SegmentGraph
    #: sender (tracked step name or source key) -> the segments it sends into
    sends_into: dict[str, tuple[str, ...]]
    sinks: tuple[str, ...]

    def fan_out(self) -> dict[str, tuple[str, ...]]:
        """The senders with more than one consumer."""
        return {s: segs for s, segs in self.sends_into.items() if len(segs) > 1}

    def explain(self) -> str:
        """One line per segment, upstream first: ``name <- inbound`` and its senders.

        >>> print(SegmentPlan(SegmentGraph.of(("p", ()), ("sink", ("p",))),
        ...                   {"gen:0-3": ("p",), "p": ("sink",)}, ("sink",)).explain())
        p    <- fronts of gen:0-3
        sink <- p  [sink]
        """
        g = self.graph
        width = max(len(n) for n in g.names)
        lines = []
        for i, name in enumerate(g.names):
            ups = [g.names[j] for j in g.inbound[i]]
            ups += [f"fronts of {s}" for s, segs in self.sends_into.items()
                    if name in segs and s.startswith("gen:")]
            mark = "  [sink]" if name in self.sinks else ""
            lines.append(f"{name:<{width}} <- {', '.join(ups) or 'fronts'}{mark}".rstrip())
        return "\n".join(lines)


def source_key(src: SourceSpec) -> str:
    """A source's name in the plan: a log source's (or a labelled frame's) ingest
    segment, or a generator's front range (``gen:first-last``)."""
    if src.kind != "gen":  # a log or a labelled frame: its ingest segment
        return src.name or "ingest"
    assert src.spec is not None
    ids = src.spec.front_ids()
    return f"gen:{ids[0]}-{ids[-1]}"


class _Walk:
    """The walk up from the sinks; see the module docstring."""

    def __init__(self) -> None:
        self.inbound: dict[str, set[str]] = {}
        self.sends: dict[str, list[str]] = {}
        self.owner: dict[str, object] = {}
        self.generators: dict[str, SourceSpec] = {}

    def claim(self, name: str, owner: object, what: str) -> None:
        if self.owner.setdefault(name, owner) is not owner:
            raise PipelineShapeError(f"the name {name!r} is used twice ({what}): "
                                     "give one of them another name=")

    def send(self, sender: str, segment: str) -> None:
        targets = self.sends.setdefault(sender, [])
        if segment in targets:
            raise PipelineShapeError(f"{sender!r} reaches {segment!r} twice (a stream "
                                     "unioned with itself?)")
        targets.append(segment)

    def segment(self, name: str, *inbound: str) -> None:
        self.inbound.setdefault(name, set()).update(inbound)

    def sink(self, stream: Stream, name: str) -> None:
        self.claim(name, ("sink", name), "a sink")
        self.segment(name)
        self.into(stream, name)

    def into(self, stream: Stream, segment: str) -> None:
        """``stream``'s rows are sent into ``segment``: walk up from there."""
        for step in reversed(stream.steps):
            segments = step.segments()
            if not segments:
                continue
            walked = step.name in self.sends
            for s in segments:
                self.claim(s, step, "a step")
            self.send(step.name, segment)
            self.segment(segment, segments[-1])
            if walked:  # fan-out: what is above this step is walked already
                return
            for up, down in pairwise(segments):
                self.segment(down, up)
            segment = segments[0]
            self.segment(segment)
        if stream.inputs:
            for branch in reversed(stream.inputs):
                self.into(branch, segment)
            return
        assert stream.source is not None
        self.source(stream.source, segment)

    def source(self, src: SourceSpec, segment: str) -> None:
        key = source_key(src)
        self.claim(key, src, "a source")
        self.send(key, segment)
        if src.kind != "gen":  # a log or a labelled frame: its ingest segment
            self.segment(key)
            self.segment(segment, key)
        else:
            self.generators[key] = src

    def check_generators(self) -> None:
        fronts: dict[int, str] = {}
        for key, src in self.generators.items():
            targets = self.sends[key]
            if len(targets) > 1:
                raise PipelineShapeError(f"generator {key} feeds {', '.join(targets)}: a "
                                         "generator's fronts feed one segment")
            if self.inbound[targets[0]]:
                raise PipelineShapeError(
                    f"generator {key} and tracked steps send into {targets[0]!r}: add a "
                    f"tracked step after the generator")
            assert src.spec is not None
            for f in src.spec.front_ids():
                if fronts.setdefault(f, key) != key:
                    raise PipelineShapeError(f"front {f} is in {fronts[f]} and {key}: set "
                                             "first_front so front ranges do not overlap")


    def key_ranges(self) -> dict[str, tuple[int, FrontRanges]]:
        """The segments split into key ranges (rule 15): a ``key_ranges`` step's
        inbound segment and each one up to its source (narrow steps between keep each
        row's range, its front's); the source segment lists the range of each front."""
        out: dict[str, tuple[int, FrontRanges]] = {}
        for name, step in self.owner.items():
            if getattr(step, "key_ranges", 0) and name == getattr(step, "name", None):
                self._split_up(step, out)
        return out

    def _split_up(self, step: object, out: dict[str, tuple[int, FrontRanges]]) -> None:
        """Split ``step``'s inbound segment, then each one above it up to the segment
        its source's fronts feed, or refuse a sender that is neither."""
        name, n = getattr(step, "name", ""), getattr(step, "key_ranges", 0)
        segment = name
        while True:
            out[segment] = (n, ())
            feeders = [key for key, segs in self.sends.items() if segment in segs]
            sender = self.owner.get(feeders[0]) if len(feeders) == 1 else None
            if isinstance(sender, SourceSpec):
                if sender.kind != "gen":  # its ingest segment is the one fronts feed
                    segment = feeders[0]
                out[segment] = (n, front_ranges(name, n, sender,
                                                dict(getattr(step, "front_ranges", ()))))
                return
            if getattr(sender, "kind", None) not in NARROW_KINDS:
                raise PipelineShapeError(
                    f"{name!r}: key_ranges needs its rows straight from one source, through "
                    f"narrow steps only ({', '.join(NARROW_KINDS)}, select, with_column); "
                    f"{segment!r} is fed by {', '.join(sorted(feeders))}")
            segment = feeders[0]


def front_ranges(name: str, n: int, src: SourceSpec, given: dict[int, int]) -> FrontRanges:
    """The range each front of ``src`` feeds: ``given`` (the window's ``front_ranges=``),
    else ``front % n``; the fronts must be known where the pipeline is built."""
    if src.spec is not None:
        ids = src.spec.front_ids()
    else:
        ids = sorted(src.fronts.ids) if src.fronts is not None else sorted(given)
    if not ids:
        raise PipelineShapeError(
            f"{name!r}: key_ranges needs the fronts of {source_key(src)!r} listed (read_log(path, "
            f"fronts=[...]) or read_stream(df, fronts=[...])) or front_ranges={{front: "
            f"range}}: each front's range is stated where the pipeline is built")
    missing = [f for f in ids if given and f not in given]
    if missing:
        raise PipelineShapeError(f"{name!r}: front_ranges has no range for front(s) "
                                 f"{missing}: give every front of {source_key(src)} its range")
    return tuple((f, (given[f] if given else f % n,)) for f in ids)


def derive(sinks: Sequence[tuple[Stream, str]]) -> SegmentPlan:
    """The segment plan of the streams written to ``sinks`` (stream, sink name)."""
    walk = _Walk()
    # walked last to first and read backwards: upstream first, in the order of the
    # description, which the topological order keeps where the graph allows it
    for stream, name in reversed(sinks):
        walk.sink(stream, name)
    for name, step in list(walk.owner.items()):  # a retry loop: step <-> loop (rule 11)
        if getattr(step, "name", None) == name and hasattr(step, "loop"):
            walk.claim(step.loop, step, "a retry loop")
            walk.segment(step.loop, name)
            walk.segment(name, step.loop)
    walk.check_generators()
    ranged = walk.key_ranges()
    specs = [SegmentSpec(name, tuple(sorted(ups)), *ranged.get(name, (0, ())))
             for name, ups in reversed(walk.inbound.items())]
    try:
        graph = SegmentGraph.of(*specs)
    except GraphError as exc:
        raise PipelineShapeError(str(exc)) from None
    sends = {s: tuple(reversed(t)) for s, t in walk.sends.items()}
    return SegmentPlan(graph, sends, tuple(name for _, name in sinks))


def covers(whole: SegmentGraph, part: SegmentGraph) -> bool:
    """Is every segment of ``part`` in ``whole`` with the same inbound segments? (A
    query on a part then sends and receives exactly what the whole expects there.)"""

    def ups(g: SegmentGraph, name: str) -> set[str]:
        return {g.names[j] for j in g.inbound[g.index(name)]}

    return all(n in whole and ups(whole, n) == ups(part, n) for n in part.names)


def refuse_fan_out(plan: SegmentPlan) -> SegmentPlan:
    """``plan``, or a one-line error naming a sender read by several consumers: a
    tracked step's task sends its children into one segment, so a step (or source)
    shared by two branches would leave the other branch's copies unsent. Fan-out is
    built at the front instead (rule 11): one ``read_log(path, name=...)`` per branch,
    whose fronts send each record into every branch's ingest segment."""
    fan_out = plan.fan_out()
    if fan_out:
        sender, segments = next(iter(fan_out.items()))
        raise PipelineShapeError(
            f"{sender!r} feeds {', '.join(segments)}: a step or source shared by two "
            "branches is not built in Spark; read the log once per branch "
            "(read_log(path, name=...)) and describe its steps once per branch")
    return plan
