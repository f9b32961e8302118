"""The tracker server's configuration (frozen; ``.build()`` makes the server)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lowtide.core.dead_fronts import FrontTimeout
from lowtide.core.graph import SegmentGraph
from lowtide.core.sharding import ShardLayout
from lowtide.core.time import Clock, TimeGrid
from lowtide.service import net
from lowtide.service.auth import is_loopback
from lowtide.service.engine.base import Engine, EngineConfig
from lowtide.service.engine.central import CentralEngine
from lowtide.service.engine.coordinator import CoordinatorEngine
from lowtide.service.engine.shard import ShardEngine
from lowtide.service.freshness import Sla
from lowtide.service.ha.config import HaConfig
from lowtide.service.server.ticker import CENTRAL_TICK_MS, FAST_TICK_MS
from lowtide.service.server.tracker_server import TrackerServer


@dataclass(frozen=True)
class ServerConfig:
    """``graph`` None: adopt the graph of the first client (standalone server)."""

    graph: SegmentGraph | None = None
    grid: TimeGrid = TimeGrid()
    host: str = "127.0.0.1"
    port: int = 0
    listen: bool = True
    state_dir: Path | None = None
    fsync: bool = False
    snapshot_every_ms: int = 30_000
    secret: bytes | None = None
    limits: net.Limits = net.Limits()
    #: how often the state task wakes with no request (None: by role, see tick_every_ms)
    tick_ms: int | None = None
    metrics_every_ms: int = 1_000
    stuck_after_ms: int = 5_000
    max_windows: int = 1 << 20
    dedup_retention_ms: int = 24 * 3_600_000
    max_keys: int = 1_000_000
    #: a live producer keeps its front from its owner's other sessions while seen
    #: within this long (lowtide.core.holders); 0: a successor takes over at once
    front_lease_ms: int = 1_000
    #: a live front silent this long is dead (None: never), and the policy then:
    #: "wait" (say so) or "retire" (lowtide.core.dead_fronts, rule 17)
    front_timeout_ms: int | None = None
    dead_fronts: str = "wait"
    #: each sink's windows of sla_window_ms are late sla_ms after their end (None: no
    #: SLA): a log line, a metric and the status name each one (lowtide.service.freshness)
    sla_ms: int | None = None
    sla_window_ms: int = 1_000
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # unauthenticated: loopback unless asked
    web_port: int | None = None  # the web view (service.web): None off, 0 a free port
    web_host: str = "127.0.0.1"  # another address requires the secret
    name: str = "lowtide"
    pipeline: str = "default"  # the metrics' pipeline label
    shard: tuple[int, int] | None = None  # (index, count): this server is one shard
    shard_urls: tuple[str, ...] = ()  # this server coordinates these shards
    #: a group of trackers sharing a step log in Kafka (rule 18): this one stands by
    #: until the leader is silent for the lease, then leads
    ha: HaConfig | None = None

    def __post_init__(self) -> None:
        if self.listen and not is_loopback(self.host) and self.secret is None:
            raise ValueError(
                f"binding {self.host} (not loopback) requires a shared secret "
                "(--secret-file or LOWTIDE_SECRET)"
            )
        if self.web_port is not None and not is_loopback(self.web_host) and self.secret is None:
            raise ValueError(
                f"serving the web view on {self.web_host} (not loopback) requires a shared "
                "secret (--secret-file or LOWTIDE_SECRET), or keep --web-host 127.0.0.1"
            )
        if self.front_timeout_ms is not None:  # a bad dead-front policy: refused now
            FrontTimeout(self.front_timeout_ms, self.dead_fronts)
            if self.shard is not None or self.shard_urls:
                raise ValueError("--front-timeout-s works with a central tracker only (each "
                                 "shard would retire on its own clock): drop --shards")
        self.sla()
        if self.ha is not None and (self.state_dir is not None or self.shard is not None
                                    or self.shard_urls):
            raise ValueError("--ha keeps the state in the group's Kafka topic: drop "
                             "--state-dir and --shards")

    def tick_every_ms(self) -> int:
        """``tick_ms``, else: a shard, a coordinator and a group's trackers every
        FAST_TICK_MS, a central tracker every CENTRAL_TICK_MS (and at its questions'
        times: lowtide.service.server.ticker)."""
        if self.tick_ms is not None:
            return self.tick_ms
        fast = self.shard is not None or bool(self.shard_urls) or self.ha is not None
        return FAST_TICK_MS if fast else CENTRAL_TICK_MS

    def sla(self) -> Sla | None:
        return None if self.sla_ms is None else Sla(self.sla_ms, self.sla_window_ms)

    def engine(self, graph: SegmentGraph) -> Engine:
        """The engine of this server's role: one shard, a coordinator of shards, or a
        central tracker."""
        config = self.engine_config(graph)
        if self.shard is not None:
            index, count = self.shard
            return ShardEngine(config, ShardLayout(count, self.grid.window_slots), index)
        if self.shard_urls:
            return CoordinatorEngine(config, self.shard_urls)
        return CentralEngine(config)

    def engine_config(self, graph: SegmentGraph) -> EngineConfig:
        timeout = None
        if self.front_timeout_ms is not None:
            timeout = FrontTimeout(self.front_timeout_ms, self.dead_fronts)
        return EngineConfig(
            graph,
            self.grid,
            max_windows=self.max_windows,
            stuck_after_ms=self.stuck_after_ms,
            dedup_retention_ms=self.dedup_retention_ms,
            max_keys=self.max_keys,
            front_lease_ms=self.front_lease_ms,
            front_timeout=timeout,
        )

    def build(self, clock: Clock | None = None) -> TrackerServer:
        return TrackerServer(self, clock)
