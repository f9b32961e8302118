"""A small pipeline where items get lost, for the web view's tests.

``src`` feeds ``parse`` and ``enrich``, both feed ``sink``. Front 1 sends
:data:`ITEMS` items at one slot; they go through ``src`` into ``parse``, where
:data:`LOST` of them are sent and never received; the rest reach ``sink`` and
leave. The front's heartbeat then moves past the slot, so ``parse``'s window is
incomplete past its bound: stuck, with :data:`LOST` items missing.
"""

from __future__ import annotations

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.service import Agent, BatchKey

SPEC = [["src", []], ["parse", ["src"]], ["enrich", ["src"]], ["sink", ["parse", "enrich"]]]
ITEMS = 5
LOST = 2
FRONT = 1


def graph() -> SegmentGraph:
    return SegmentGraph.of(*((name, tuple(ups)) for name, ups in SPEC))


def lose_items(agent: Agent, slot: int) -> None:
    """Run :data:`ITEMS` items of ``slot`` through the pipeline, losing :data:`LOST`
    in ``parse``; then heartbeat past the slot."""
    g = graph()
    src, parse, sink = g.index("src"), g.index("parse"), g.index("sink")
    items = root_acks(FRONT, np.arange(ITEMS, dtype=np.uint64))
    parsed = child_acks(items, operator=1, child_index=np.zeros(ITEMS, np.uint64))
    done = child_acks(parsed, operator=2, child_index=np.zeros(ITEMS, np.uint64))
    kept = parsed[LOST:]

    def acks(segment: int, values: np.ndarray, count: int) -> AckBatch:
        return AckBatch.from_columns(segment, np.full(len(values), slot), values, count)

    agent.register_front(FRONT, "src", slot)
    agent.send_batch(BatchKey("q", 0, "src", 0), acks(src, items, 1))
    into_parse = AckBatch.concat([acks(parse, parsed, 1), acks(src, items, -1)])
    agent.send_batch(BatchKey("q", 0, "parse", 0), into_parse)
    agent.send_batch(
        BatchKey("q", 0, "sink", 0),
        AckBatch.concat([acks(sink, done[LOST:], 1), acks(parse, kept, -1)]),
    )
    agent.send_batch(
        BatchKey("q", 0, "out", 0), acks(sink, done[LOST:], -1), [Heartbeat(FRONT, slot + 10)]
    )
