"""A shard's engine without sockets (rule 8): flushes with their node times in, reports
for the coordinator out, the clock injected. Shard 0 of 2 owns the even windows (one
slot each here)."""

from __future__ import annotations

import pytest

from lowtide.core.messages import NodeTime, ShardRelease
from lowtide.core.sharding import ShardLayout
from lowtide.service.client.batches import BatchKey, stream_time
from lowtide.service.engine.shard import ShardEngine
from lowtide.service.errors import ServiceError
from lowtide.wire.messages import Error, ErrorCode, Ok, ShardReleaseFrame
from tests.service.engine.helpers import CONFIG, SRC, Session, send

LAYOUT = ShardLayout(n_shards=2, window_slots=1)


def shard_zero() -> tuple[ShardEngine, Session]:
    shard, producer = ShardEngine(CONFIG, LAYOUT, 0), Session(7)
    assert shard.handle(producer.register(1, "src", 10), now_ms=0) == Ok(1)
    return shard, producer


def test_a_shard_reports_what_it_applied_with_its_node_times() -> None:
    """Each report carries the shard's min times, every node's latest counter, and the
    flushes it keeps until every shard has them (the coordinator's in-transit cap)."""
    shard, producer = shard_zero()
    proven = producer.flush(send(SRC, 12, 0xA), heartbeats=(producer.beat(1, 50),),
                            node_time=NodeTime(7, 1, 12))
    assert shard.handle(proven, 1) == Ok(proven.req)
    report = shard.step(1).report
    assert report is not None
    assert report.min_times == (12, 12)  # its own window 12 holds the item
    assert report.node_times == ((7, 1),) and report.flushes == ((7, 1, 12),)
    assert shard.step(2).report is None  # nothing changed: nothing to report
    # the coordinator says every shard reached flush 1 of node 7: no need to keep it
    shard.release(ShardReleaseFrame(ShardRelease((12, 12)), complete=((7, 1),)))
    assert shard.watch().flushes == ()


def test_acks_without_a_proven_node_time_hold_the_shard_for_good() -> None:
    """Rule 8: a flush whose acks come without a node time (or below the min time it
    claims) is refused, and since the rest of that flush may have reached other shards,
    this shard's min times stay at or below the refused acks from then on; a snapshot
    keeps the hold, so a restart does not lift it."""
    shard, producer = shard_zero()
    beat = producer.flush(heartbeats=(producer.beat(1, 50),), node_time=NodeTime(7, 1, 50))
    shard.handle(beat, 1)
    shard.step(1)
    assert shard.watch().min_times == (50, 50)
    stray = Session(8).flush(send(SRC, 20, 0xA))
    refused = shard.handle(stray, 2)
    assert isinstance(refused, Error) and refused.code == ErrorCode.BAD_REQUEST
    assert "rule 8" in refused.message
    liar = Session(9).flush(send(SRC, 24, 0xB), node_time=NodeTime(9, 1, 30))
    assert isinstance(shard.handle(liar, 3), Error)  # claims 30 above its ack at 24
    beat = producer.flush(heartbeats=(producer.beat(1, 70),), node_time=NodeTime(7, 2, 70))
    shard.handle(beat, 4)
    report = shard.step(4).report
    assert report is not None and report.min_times == (20, 20)  # not 70
    restarted = ShardEngine(CONFIG, LAYOUT, 0)
    restarted.restore(*shard.export())
    assert restarted.hold == 20 and restarted.watch() == shard.watch()


def test_a_keyed_batch_after_a_later_one_of_its_stream_is_refused() -> None:
    """A stream's (query, segment, partition) node counts batch ids: batch 1 arriving
    after batch 2 cannot be placed in the shard's vector, so it is refused (Spark's
    micro-batches of one stream arrive in order)."""
    shard, task = ShardEngine(CONFIG, LAYOUT, 0), Session(9)
    shard.handle(task.register(1, "src", 10), 0)
    later, earlier = BatchKey("q", 2, "src", 0), BatchKey("q", 1, "src", 0)
    first = task.keyed(later.text(), send(SRC, 10, 1), node_time=stream_time(later, 10))
    assert shard.handle(first, 1) == Ok(first.req)
    late = task.keyed(earlier.text(), send(SRC, 12, 2), node_time=stream_time(earlier, 12))
    refused = shard.handle(late, 2)
    assert isinstance(refused, Error) and "after a later batch" in refused.message


def test_a_shard_serves_no_subscriptions_and_names_its_place() -> None:
    shard = ShardEngine(CONFIG, LAYOUT, 1)
    with pytest.raises(ServiceError, match="subscribe at the coordinator"):
        shard.current("src")
    assert shard.identity() == {"delta_ms": 10, "window_slots": 1, "shard": [1, 2]}
