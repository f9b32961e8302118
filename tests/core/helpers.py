"""What several core test modules share."""

from __future__ import annotations

from collections.abc import Iterable

from lowtide.core.messages import Flush, RegisterFront
from lowtide.core.sharding import ShardAggregator, ShardLayout, ShardRouter, TrackerShard
from lowtide.core.tracker import Tracker, TrackerConfig


def one_shard_beside_central(config: TrackerConfig, fronts: Iterable[RegisterFront],
                             flushes: Iterable[Flush]) -> tuple[Tracker, ShardAggregator]:
    """``flushes`` applied to a central tracker and, routed, to one shard and its
    aggregator (which releases back after each): both announce the same, step by step."""
    central = config.build()
    layout = ShardLayout(1, window_slots=config.grid.window_slots)
    only = TrackerShard(config, layout, 0)
    router = ShardRouter(layout, node=0)
    agg = ShardAggregator(config.graph, 1)
    for front in fronts:
        central.register_front(front)
        only.register_front(front)
    for flush in flushes:
        central.receive_flush(flush)
        for part in router.route(flush):
            only.receive(part)
        expected = central.step(0).updates
        report = only.step(0)
        assert list(expected) == (agg.receive(report) if report is not None else [])
        only.release(agg.release())
    return central, agg
