"""lowtide in the simulated cluster, driving the real core.

Modes (the tracker sits on its own node(s), like the paper's):

* ``central``: a :class:`~lowtide.core.local.LocalTracker` on every worker node and on
  the bench stand XOR-merges the node's acks by (segment, window) and flushes every
  ``flush_interval_us``, front heartbeat last, to one
  :class:`~lowtide.core.tracker.Tracker`.
* ``sharded``: the same local trackers; each flush goes through the node's
  :class:`~lowtide.core.sharding.ShardRouter` to 2 :class:`TrackerShard` nodes (NodeTime
  rides on every shard's part of a flush with acks); the bench stand runs the
  :class:`ShardAggregator` on the shards' reports.
* ``direct``: no local tracker: every ack is its own message, and every front heartbeat.

Every tracker node drains its inbox every ``tracker_tick_us``: it applies what arrived
since the previous tick in arrival order (FIFO per link) and steps once. Applying a group
at once and stepping after it is the same state as applying one by one, so no
notification is earlier than the protocol allows; it adds at most one tick of delay.

Segments: ``to_v1 .. to_vN, to_sink``; segment s holds the items sent to stage s+1.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from lowtide.bench.sim.dataflow import US_PER_MS, Dataflow, Workload
from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTrackerConfig
from lowtide.core.messages import AckBatch, Flush, Heartbeat, RegisterFront, ShardRelease
from lowtide.core.sharding import ShardAggregator, ShardLayout, ShardRouter, TrackerShard
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig

MODES = ("central", "sharded", "direct")
SHARDS = 2
RELEASE_EVERY_US = 10_000  # how often the aggregator lets the shards drop old windows
ACTIVE, DONE, FINAL_SENT = 0, 1, 2  # front states: emitting, emitted all, said so


def chain_graph(vertices: int) -> SegmentGraph:
    names = [f"to_v{s + 1}" for s in range(vertices)] + ["to_sink"]
    return SegmentGraph.of(*((n, (names[i - 1],) if i else ()) for i, n in enumerate(names)))


def hop_acks(codes: list[int], work: Workload, stages: int) -> AckBatch:
    """Acks of recorded hops; a code is ``item * stages + stage``. Stage s < N+1 sends
    the item's copy into segment s (+1); stage s > 0 received it from segment s-1 (-1)."""
    item, stage = np.divmod(np.asarray(codes, np.int64), stages)
    send, recv = stage < stages - 1, stage > 0
    seg = np.concatenate([stage[send], stage[recv] - 1])
    items = np.concatenate([item[send], item[recv]])
    count = np.concatenate([np.ones(int(send.sum()), np.int64), np.full(int(recv.sum()), -1)])
    return AckBatch.from_columns(seg, work.slot[items], work.acks[items, seg], count)


class Inbox:
    """A tracker node's mailbox, drained once per tick in arrival order."""

    def __init__(self, flow: Dataflow, node: int, drain: Callable[[list[Any]], None]) -> None:
        self._flow, self.node, self._drain = flow, node, drain
        self._tick_us = flow.cfg.tracker_tick_us
        self._buckets: dict[int, list[tuple[int, int, Any]]] = {}
        self._seq = 0

    def deliver(self, src: int, msg: Any) -> None:
        loop = self._flow.loop
        arrival = self._flow.links.arrival_us(src, self.node, loop.now_us)
        tick = arrival // self._tick_us + 1
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = []
            loop.at(tick * self._tick_us, self._on_tick, tick)
        self._seq += 1
        bucket.append((arrival, self._seq, msg))

    def _on_tick(self, tick: int) -> None:
        self._drain([m for _, _, m in sorted(self._buckets.pop(tick), key=lambda x: x[:2])])


class LowtideTracking:
    """Agents on every worker node and the bench stand, plus the tracker side."""

    def __init__(self, flow: Dataflow, mode: str, notify_workers: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if notify_workers and mode == "sharded":
            raise ValueError("sharded mode notifies the bench stand (its aggregator) only")
        cfg = flow.cfg
        self.flow, self.mode = flow, mode
        self.grid = TimeGrid(delta_ms=1, window_slots=cfg.window_slots)
        self.graph = chain_graph(cfg.vertices)
        self.stages = cfg.vertices + 2
        self.counts: Counter[str] = Counter()
        self.notes: list[tuple[int, int]] = []  # (time_us, global min time) at the stand
        self.on_notified: Callable[[int, int], None] | None = None
        self.subscribers = (*(range(cfg.nodes) if notify_workers else ()), flow.stand)
        agents = cfg.nodes + 1  # workers and the bench stand
        self._pending: list[list[int]] = [[] for _ in range(agents)]
        self._armed = [False] * agents
        rng = random.Random(cfg.seed)
        self._phase_us = [rng.randrange(cfg.flush_interval_us) for _ in range(agents)]
        self._fronts = [ACTIVE] * cfg.nodes
        self._last_hb = [-1] * cfg.nodes
        w = cfg.window_slots
        self.final_slot = (int(flow.work.slot.max()) // w + 2) * w
        local = LocalTrackerConfig(self.grid, max_age_ms=max(1, cfg.flush_interval_us // 1000))
        self._locals = [local.build(node) for node in range(agents)]
        tracker = TrackerConfig(self.graph, self.grid)
        self.server: CentralServer | ShardedServer = (
            ShardedServer(self, tracker) if mode == "sharded" else CentralServer(self, tracker)
        )
        for node in range(cfg.nodes):
            self._arm(node)  # fronts heartbeat from the start

    @property
    def _central(self) -> CentralServer:
        assert isinstance(self.server, CentralServer)
        return self.server

    # ------------------------------------------------------- hooks of the dataflow
    def emitted(self, node: int, item: int) -> None:
        self._ack(node, item * self.stages)

    def processed(self, node: int, stage: int, item: int) -> None:
        self._ack(node, item * self.stages + stage)

    def sunk(self, item: int) -> None:
        self._ack(self.flow.stand, item * self.stages + self.stages - 1)

    def front_done(self, node: int) -> None:
        self._fronts[node] = DONE
        self._arm(node)

    # ------------------------------------------------------------- node agents
    def _ack(self, node: int, code: int) -> None:
        if self.mode == "direct":
            stage = code % self.stages
            self.counts["to_tracker"] += 1 if stage in (0, self.stages - 1) else 2
            self._central.deliver(node, code)  # the hop's acks, back to back, child first
            return
        self._pending[node].append(code)
        if not self._armed[node]:
            self._arm(node)

    def _arm(self, node: int) -> None:
        if self._armed[node]:
            return
        self._armed[node] = True
        loop, every = self.flow.loop, self.flow.cfg.flush_interval_us
        loop.at(
            loop.now_us + every - (loop.now_us - self._phase_us[node]) % every, self._flush, node
        )

    def _flush(self, node: int) -> None:
        self._armed[node] = False
        hb = self._heartbeat(node)
        if self.mode == "direct":
            if hb is not None:
                self.counts["to_tracker"] += 1
                self.counts["heartbeat_messages"] += 1
                self._central.deliver(node, hb)
        else:
            self._flush_local(node, hb)
        if node < self.flow.cfg.nodes and self._fronts[node] != FINAL_SENT:
            self._arm(node)

    def _flush_local(self, node: int, hb: Heartbeat | None) -> None:
        local, now_ms = self._locals[node], self.flow.loop.now_us // US_PER_MS
        codes, self._pending[node] = self._pending[node], []
        if codes:
            local.add_acks(hop_acks(codes, self.flow.work, self.stages), now_ms)
        if hb is not None:
            local.add_heartbeat(hb, now_ms)  # after the acks it covers (rule 3)
        flush = local.flush()
        if flush is None:
            return
        self.counts["local_flushes"] += 1
        if isinstance(self.server, ShardedServer):
            self.server.route(node, flush)
        else:
            self.counts["to_tracker"] += 1
            self.server.deliver(node, flush)

    def _heartbeat(self, node: int) -> Heartbeat | None:
        """The node's front: "no more items below the current slot", or the final one."""
        if node >= self.flow.cfg.nodes or self._fronts[node] == FINAL_SENT:
            return None
        if self._fronts[node] == DONE:
            self._fronts[node] = FINAL_SENT
            return Heartbeat(node, self.final_slot)
        slot = self.flow.loop.now_us // US_PER_MS
        if slot <= self._last_hb[node]:
            return None
        self._last_hb[node] = slot
        return Heartbeat(node, slot)

    # --------------------------------------------------------- notifications
    def notify(self, src: int, min_time: int) -> None:
        """The tracker announces a new global min time to every subscriber."""
        loop = self.flow.loop
        for node in self.subscribers:
            self.counts["back"] += 1
            loop.at(
                self.flow.links.arrival_us(src, node, loop.now_us), self.notified, node, min_time
            )

    def notified(self, node: int, min_time: int) -> None:
        if node == self.flow.stand:
            self.notes.append((self.flow.loop.now_us, min_time))
        if self.on_notified is not None:
            self.on_notified(node, min_time)

    def register_fronts(self, register: Callable[[RegisterFront], None]) -> None:
        for front in range(self.flow.cfg.nodes):
            register(RegisterFront(front, self.graph.names[0], 0))


class CentralServer:
    """One :class:`Tracker` on node ``stand + 1``."""

    def __init__(self, owner: LowtideTracking, config: TrackerConfig) -> None:
        self.owner = owner
        self.tracker = config.build()
        owner.register_fronts(self.tracker.register_front)
        self.applied_flushes = 0
        self.inbox = Inbox(owner.flow, owner.flow.stand + 1, self._drain)
        self.deliver = self.inbox.deliver

    def _drain(self, msgs: list[Any]) -> None:
        codes: list[int] = []
        heartbeats: dict[int, int] = {}
        for msg in msgs:
            if isinstance(msg, Flush):
                self.tracker.receive_flush(msg)
                self.applied_flushes += 1
            elif isinstance(msg, Heartbeat):
                heartbeats[msg.front] = max(msg.time, heartbeats.get(msg.front, msg.time))
            else:
                codes.append(msg)
        # direct mode: every ack and heartbeat that arrived this tick, heartbeats last
        if codes:
            self.tracker.apply(hop_acks(codes, self.owner.flow.work, self.owner.stages))
        for front, time in sorted(heartbeats.items()):
            self.tracker.heartbeat(Heartbeat(front, time))
        now_ms = self.owner.flow.loop.now_us // US_PER_MS
        for update in self.tracker.step(now_ms).updates:
            if update.segment is None:
                self.owner.notify(self.inbox.node, update.time)


class ShardedServer:
    """:class:`TrackerShard` k on node ``stand + 1 + k``; the aggregator on the stand."""

    def __init__(self, owner: LowtideTracking, config: TrackerConfig) -> None:
        self.owner = owner
        flow = owner.flow
        layout = ShardLayout(SHARDS, config.grid.window_slots)
        self.shards = [TrackerShard(config, layout, k) for k in range(SHARDS)]
        for shard in self.shards:
            owner.register_fronts(shard.register_front)
        self.inboxes = [
            Inbox(flow, flow.stand + 1 + k, partial(self._drain, k)) for k in range(SHARDS)
        ]
        self.routers = [ShardRouter(layout, node) for node in range(flow.cfg.nodes + 1)]
        self.aggregator = ShardAggregator(config.graph, SHARDS)
        self.applied_flushes = 0
        self._released_us = 0

    def route(self, node: int, flush: Flush) -> None:
        for part in self.routers[node].route(flush):
            self.owner.counts["to_tracker"] += 1
            if len(part.acks) == 0 and not part.heartbeats:
                self.owner.counts["node_time_only"] += 1
            self.inboxes[part.shard].deliver(node, part)

    def _drain(self, k: int, msgs: list[Any]) -> None:
        shard = self.shards[k]
        for msg in msgs:
            if isinstance(msg, ShardRelease):
                shard.release(msg)
            else:
                shard.receive(msg)
                self.applied_flushes += 1
        loop = self.owner.flow.loop
        report = shard.step(loop.now_us // US_PER_MS)
        if report is not None:
            self.owner.counts["back"] += 1
            stand = self.owner.flow.stand
            arrival = self.owner.flow.links.arrival_us(self.inboxes[k].node, stand, loop.now_us)
            loop.at(arrival, self._report, report)

    def _report(self, report: Any) -> None:
        stand, loop = self.owner.flow.stand, self.owner.flow.loop
        updates = self.aggregator.receive(report)
        for update in updates:
            if update.segment is None:
                self.owner.notified(stand, update.time)
        if updates and loop.now_us - self._released_us >= RELEASE_EVERY_US:
            self._released_us = loop.now_us
            for inbox in self.inboxes:
                self.owner.counts["releases"] += 1
                inbox.deliver(stand, self.aggregator.release())
