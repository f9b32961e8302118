"""The coordinator's engine without sockets, alone and with two shard engines: what its
server's ShardWatch would carry (reports in, releases out) is handed over by hand, so
every interleaving is a choice of the test. Shard k of 2 owns the windows w with
w % 2 == k (one slot each here)."""

from __future__ import annotations

from typing import Any

from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.local import LocalTrackerConfig
from lowtide.core.messages import (
    Ack,
    AckBatch,
    Heartbeat,
    MinTimeUpdate,
    ShardFlush,
    ShardReport,
)
from lowtide.core.sharding import ShardLayout, ShardRouter
from lowtide.service.engine.base import EngineConfig, StepResult
from lowtide.service.engine.coordinator import CoordinatorEngine
from lowtide.service.engine.shard import ShardEngine
from lowtide.wire.messages import Error, ErrorCode
from tests.service.engine.helpers import CONFIG, SINK, SRC, Session, recv, send

URLS = ("tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002")
LAYOUT = ShardLayout(n_shards=2, window_slots=1)


class Cluster:
    """Two shard engines and their coordinator; one agent (node 7) whose local tracker
    and router split each flush as a real agent does."""

    def __init__(self, config: EngineConfig = CONFIG) -> None:
        self.shards = [ShardEngine(config, LAYOUT, k) for k in range(2)]
        self.coordinator = CoordinatorEngine(config, URLS)
        self.agent = Session(7)
        self._local = LocalTrackerConfig(config.grid, max_age_ms=5).build(7)
        self._router = ShardRouter(LAYOUT, 7)

    def register_front(self, front: int, at: int) -> None:
        """Every shard registers the front (at time 0); their reports reach the
        coordinator."""
        for shard in self.shards:
            shard.handle(self.agent.register(front, "src", at), 0)
            report = shard.step(0).report
            assert report is not None
            self.coordinator.receive(report)

    def flush(self, *acks: Ack, heartbeats: tuple[Heartbeat, ...] = ()) -> list[ShardFlush]:
        """The agent's next flush, one part per shard (each with the flush's node time)."""
        self._local.add_acks(AckBatch.of(list(acks)), 0)
        for hb in heartbeats:
            self._local.add_heartbeat(hb, 0)
        flush = self._local.flush()
        assert flush is not None
        return self._router.route(flush)

    def deliver(self, part: ShardFlush, now_ms: int) -> None:
        """Shard ``part.shard`` applies its part and steps; its report, if any, reaches
        the coordinator (a ShardWatch posts it to the state task)."""
        shard = self.shards[part.shard]
        shard.handle(self.agent.part(part), now_ms)
        report = shard.step(now_ms).report
        if report is not None:
            self.coordinator.receive(report)

    def announced(self, now_ms: int) -> dict[str | None, int]:
        step = self.coordinator.step(now_ms)
        if step.release is not None:  # what ShardWatch.release sends every shard
            for shard in self.shards:
                shard.release(step.release)
        return {u.segment: u.time for u in step.updates}


def test_a_flush_half_applied_across_shards_announces_nothing() -> None:
    """An item at slot 10 (shard 0's window) is received and turned into a child at
    slot 11 (shard 1's). Once shard 0 applied its part of that flush, both shards'
    reports alone would say the sink is empty below 12: the child is still on its
    way to shard 1. The flush's node time, which shard 0 reports and shard 1 has not,
    caps what the coordinator announces (rule 8)."""
    cluster = Cluster()
    cluster.register_front(1, at=10)
    assert cluster.announced(0) == {"src": 10, "sink": 10, None: 10}
    for part in cluster.flush(send(SRC, 10, 0xA), heartbeats=(cluster.agent.beat(1, 12),)):
        cluster.deliver(part, 1)
    assert cluster.announced(1) == {}  # the item at 10 is in flight
    to_zero, to_one = cluster.flush(recv(SRC, 10, 0xA), send(SINK, 11, 0xB))
    cluster.deliver(to_zero, 2)
    naive = min(s.watch().min_times[SINK] for s in cluster.shards)
    assert naive == 12  # without the cap: premature, the child at 11 is in transit
    assert cluster.announced(2) == {}
    cluster.deliver(to_one, 3)
    assert cluster.announced(3) == {"src": 12, "sink": 11, None: 11}
    for part in cluster.flush(recv(SINK, 11, 0xB)):
        cluster.deliver(part, 4)
    assert cluster.announced(4) == {"sink": 12, None: 12}


# src -> agg, agg split into 2 key ranges (rule 15): codes 2 and 3 are agg#0 and agg#1
RANGED = EngineConfig(SegmentGraph.of(("src", ()), SegmentSpec("agg", ("src",), key_ranges=2)),
                      CONFIG.grid)
AGG1 = RANGED.graph.cell(1, 1)


def test_a_key_range_is_capped_like_a_segment_and_served_by_name() -> None:
    """The race above, into a key range: the item at 10 becomes a row of agg#1 at 11
    (shard 1's window). Shard 0's half of that flush alone would let both shards'
    reports say agg#1 is empty below 20; the flush's node time caps each range as it
    caps a segment. The coordinator serves and shows each range's combined min time."""
    cluster = Cluster(RANGED)
    cluster.register_front(1, at=10)
    assert cluster.announced(0) == {"src": 10, "agg#0": 10, "agg#1": 10, "agg": 10, None: 10}
    for part in cluster.flush(send(SRC, 10, 0xA), heartbeats=(cluster.agent.beat(1, 20),)):
        cluster.deliver(part, 1)
    assert cluster.announced(1) == {}  # the item at 10 holds src, and agg behind it
    to_zero, to_one = cluster.flush(recv(SRC, 10, 0xA), send(AGG1, 11, 0xB))
    cluster.deliver(to_zero, 2)
    assert min(s.watch().min_times[AGG1] for s in cluster.shards) == 20  # premature
    assert cluster.announced(2) == {}
    cluster.deliver(to_one, 3)
    assert cluster.announced(3) == {"src": 20, "agg#0": 20, "agg#1": 11, "agg": 11, None: 11}
    coordinator = cluster.coordinator
    assert coordinator.current("agg#1") == MinTimeUpdate("agg#1", 11)
    assert coordinator.aggregator.release().min_times == (20, 11, 20, 11)  # per row
    agg = coordinator.status()["segments"][1]
    assert (agg["min_time"], agg["key_ranges"]) == (11, [20, 11])
    for part in cluster.flush(recv(AGG1, 11, 0xB)):
        cluster.deliver(part, 4)
    assert cluster.announced(4) == {"agg#1": 20, "agg": 20, None: 20}


def test_a_key_range_moving_alone_is_released() -> None:
    coordinator = CoordinatorEngine(RANGED, URLS)
    for k in (0, 1):
        coordinator.receive(ShardReport(k, (10, 10, 10, 10), ()))
    assert coordinator.step(0).release is not None
    for k in (0, 1):  # agg#1 moves; agg stays at agg#0's 10
        coordinator.receive(ShardReport(k, (10, 10, 10, 20), ()))
    step = coordinator.step(10)
    assert step.updates == (MinTimeUpdate("agg#1", 20),)
    assert step.release is not None and step.release.release.min_times == (10, 10, 10, 20)


def test_releases_go_out_when_something_moved() -> None:
    """A step that announced something releases at once (then at most every 5 ms);
    a tick releases whatever moved since, and nothing when nothing did. A release
    tells the shards the announced min times and, per node, the flush every shard
    reached, so they stop keeping it."""
    cluster = Cluster()
    cluster.register_front(1, at=10)
    first = cluster.coordinator.step(0).release
    assert first is not None and first.release.min_times == (10, 10) and first.complete == ()
    for part in cluster.flush(send(SRC, 10, 0xA), heartbeats=(cluster.agent.beat(1, 20),)):
        cluster.deliver(part, 1)
    assert cluster.coordinator.step(1) == StepResult()  # the item holds src at 10
    moved = cluster.coordinator.tick(2).release  # no min time moved, node 7's flush 1 did
    assert moved is not None and moved.release.min_times == (10, 10)
    assert moved.complete == ((7, 1),)
    assert cluster.coordinator.tick(3).release is None  # nothing moved since
    for part in cluster.flush(recv(SRC, 10, 0xA)):
        cluster.deliver(part, 6)
    step = cluster.coordinator.step(6)
    assert step.updates and step.release is not None and step.release.complete == ((7, 2),)
    for part in cluster.flush(heartbeats=(cluster.agent.beat(1, 30),)):
        cluster.deliver(part, 7)
    step = cluster.coordinator.step(7)
    assert step.updates and step.release is None  # 1 ms after the last release
    late = cluster.coordinator.tick(8).release
    assert late is not None and late.release.min_times == (30, 30)


def test_the_coordinator_takes_no_acks_and_sums_its_shards_status() -> None:
    coordinator, agent = CoordinatorEngine(CONFIG, URLS), Session(7)
    refused = coordinator.handle(agent.flush(send(SRC, 10, 1)), 0)
    assert isinstance(refused, Error) and refused.code == ErrorCode.BAD_REQUEST
    assert "go to the shards" in refused.message
    for k, received in enumerate((3, 4)):
        coordinator.observe_shard(k, shard_status(received))
    status = coordinator.status_document()
    assert [s["received"] for s in status["segments"]] == [7, 0]
    assert [s["url"] for s in status["shards"]] == list(URLS)
    coordinator.move(1, "tcp://127.0.0.1:7003")  # shard 1 restarted on another port
    assert coordinator.shards == (URLS[0], "tcp://127.0.0.1:7003")


def shard_status(received: int) -> dict[str, Any]:
    """A shard's status document, as much of it as the coordinator sums."""
    segment = {"bound": 0, "open_windows": 0, "in_flight": 0, "received": 0, "sent": 0}
    return {
        "segments": [{**segment, "received": received}, segment],
        "fronts": {},
        "stuck": [],
        "acks_applied": received,
    }
